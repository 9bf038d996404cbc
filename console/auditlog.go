package console

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/bulwark-pds/bulwark/audit"
)

// auditPage is how many entries one audit page shows.
const auditPage = 50

type auditView struct {
	Subject string
	Entries []auditEntry
	Before  int64 // the next page starts before this id (0: no more)
}

// auditEntry is an entry with its states as compact JSON.
type auditEntry struct {
	audit.Entry
	BeforeJSON string
	AfterJSON  string
}

func (c *Console) handleAudit(w http.ResponseWriter, r *http.Request, s session) error {
	q := r.URL.Query()
	v := auditView{Subject: strings.TrimSpace(q.Get("subject"))}
	if len(v.Subject) > 512 {
		return badRequest("The subject is too long.")
	}
	var before int64
	if b := q.Get("before"); b != "" {
		var err error
		if before, err = strconv.ParseInt(b, 10, 64); err != nil || before < 0 {
			return badRequest("Before must be an entry id.")
		}
	}
	entries, err := audit.List(r.Context(), c.cfg.DB, v.Subject, before, auditPage)
	if err != nil {
		return err
	}
	for _, e := range entries {
		v.Entries = append(v.Entries, auditEntry{Entry: e, BeforeJSON: compactJSON(e.Before), AfterJSON: compactJSON(e.After)})
	}
	if len(entries) == auditPage {
		v.Before = entries[len(entries)-1].ID
	}
	return c.show(w, s, "audit", "Audit log", "audit", v)
}

// compactJSON shows a state for a table cell, cut to a readable length.
func compactJSON(v any) string {
	if v == nil {
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return truncate(400, string(b))
}

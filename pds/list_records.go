package pds

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/bulwark-pds/bulwark/config"
)

// listRecordsFactor is the heap a listRecords page holds per byte of its
// records' CBOR: the rows read (the CBOR itself), and the JSON page being
// built (about as large, a little larger for byte strings and escapes).
// Each record is decoded and encoded on its own, so the decoding's own
// overhead (recordDecodeFactor) applies to the largest record only.
const listRecordsFactor = 3

// handleListRecords answers com.atproto.repo.listRecords. A page holds up
// to limit records and at most Config.ListMaxBytes of them, whichever
// ends it first: the database stops at that many bytes of records, and the
// JSON page stops before a record would take it past that many bytes (the
// first record always comes, so the cursor always moves on). A large page
// reserves its heap from the in-flight budget, as getRecord does.
func (s *Server) handleListRecords(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	repoID := p.required("repo")
	coll := p.required("collection")
	limit := p.intParam("limit", 50, 1, 100)
	cursor := p.optional("cursor")
	reverse := p.boolParam("reverse", false)
	if err := p.Err(); err != nil {
		return err
	}
	collection, err := parseCollection(coll)
	if err != nil {
		return err
	}
	if cursor != "" {
		if _, err := parseRKey(cursor); err != nil {
			return InvalidRequest("cursor %q is not a record key", cursor)
		}
	}
	a, err := s.resolveRepo(r.Context(), repoID)
	if err != nil {
		return err
	}
	maxBytes := s.listMaxBytes()
	recs, next, err := s.repo.ListRecords(r.Context(), a.DID, collection, cursor, int(limit), reverse, maxBytes)
	if err != nil {
		return err
	}
	var total, largest int
	for i := range recs {
		total += len(recs[i].Data)
		largest = max(largest, len(recs[i].Data))
	}
	if total >= largeRecord {
		release, err := s.guard(r.Context(), int64(total)*listRecordsFactor+int64(largest)*recordDecodeFactor)
		if err != nil {
			return err
		}
		defer release()
	}
	if recs, err = s.withoutTakendown(r.Context(), a.DID, collection, recs); err != nil {
		return err
	}

	// The page is written record by record, so that it can end at
	// maxBytes of JSON with the cursor at its last record.
	var page bytes.Buffer
	page.WriteString(`{"records":[`)
	for i := range recs {
		ro, err := recordJSON(a.DID, &recs[i])
		if err != nil {
			return err
		}
		b, err := json.Marshal(ro)
		if err != nil {
			return err
		}
		if i > 0 && int64(page.Len()+len(b)+listPageTail) > maxBytes {
			next = recs[i-1].RKey.String()
			break
		}
		if i > 0 {
			page.WriteByte(',')
		}
		page.Write(b)
	}
	page.WriteByte(']')
	if next != "" {
		page.WriteString(`,"cursor":`)
		page.WriteString(strconv.Quote(next)) // an rkey: plain ASCII
	}
	page.WriteString("}\n")
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(page.Len()))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(page.Bytes())
	return nil
}

// listPageTail is room for what follows the last record of a page (the
// cursor: an rkey of at most 512 bytes, quoted).
const listPageTail = 600

// listMaxBytes is the bound on a listRecords page.
func (s *Server) listMaxBytes() int64 {
	if s.cfg.ListMaxBytes > 0 {
		return s.cfg.ListMaxBytes
	}
	return config.DefaultListMaxBytes
}

// listRecordsOutput is the shape of a listRecords page, for clients of it
// (handleListRecords writes it record by record).
type listRecordsOutput struct {
	Cursor  string         `json:"cursor,omitempty"`
	Records []recordOutput `json:"records"`
}

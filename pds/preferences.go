package pds

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/lexicon"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/proxy"
)

// app.bsky.actor.getPreferences and putPreferences, served from the
// account's stored preferences (package account holds the rules). The
// reference PDS proxies both to the app view named in atproto-proxy when
// that is not its default one, and so does this server (preferencesElsewhere).

// MaxPreferencesBody bounds a putPreferences request. The Bluesky app's
// preferences are a few KiB; muted words and saved feeds grow them, not by
// two orders of magnitude.
const MaxPreferencesBody = 256 << 10

// preferencesCheckNSID names a record-shaped schema wrapping
// app.bsky.actor.defs#preferences, so that indigo's record validator can
// check a whole preferences array. It lives only in prefsCatalog.
const preferencesCheckNSID = "io.github.bulwark-pds.internal.preferences"

var preferencesCheckSchema = []byte(`{"lexicon": 1, "id": "` + preferencesCheckNSID + `", "defs": {"main": {
	"type": "record", "key": "any", "record": {"type": "object", "required": ["preferences"],
	"properties": {"preferences": {"type": "ref", "ref": "app.bsky.actor.defs#preferences"}}}}}}`)

var (
	prefsCatalogOnce sync.Once
	prefsCatalog     *lexicon.BaseCatalog
	prefsCatalogErr  error
)

// preferencesCatalog is the embedded lexicons plus preferencesCheckSchema,
// loaded once. It is a catalog of its own so that record writes never see
// the wrapper schema.
func preferencesCatalog() (*lexicon.BaseCatalog, error) {
	prefsCatalogOnce.Do(func() {
		c := lexicon.NewBaseCatalog()
		if err := c.LoadEmbedFS(lexiconFS); err != nil {
			prefsCatalogErr = fmt.Errorf("loading embedded lexicons: %w", err)
			return
		}
		var sf lexicon.SchemaFile
		if err := json.Unmarshal(preferencesCheckSchema, &sf); err != nil {
			prefsCatalogErr = fmt.Errorf("preferences schema: %w", err)
			return
		}
		if err := c.AddSchemaFile(sf); err != nil {
			prefsCatalogErr = fmt.Errorf("preferences schema: %w", err)
			return
		}
		prefsCatalog = c
	})
	return prefsCatalog, prefsCatalogErr
}

func (s *Server) registerPreferenceRoutes() {
	if s.accounts == nil {
		return
	}
	s.query("app.bsky.actor.getPreferences", s.handleGetPreferences)
	s.procedure("app.bsky.actor.putPreferences", s.handlePutPreferences, withMaxBody(MaxPreferencesBody))
	s.query(AdminNSIDPrefix+"getPreferences", s.admin(s.handleAdminGetPreferences))
}

// preferencesOutput is getPreferences's output: the stored objects as
// they are.
type preferencesOutput struct {
	Preferences []json.RawMessage `json:"preferences"`
}

func preferencesJSON(prefs []account.Preference) preferencesOutput {
	out := preferencesOutput{Preferences: make([]json.RawMessage, 0, len(prefs))}
	for _, p := range prefs {
		out.Preferences = append(out.Preferences, p.Value)
	}
	return out
}

// preferencesElsewhere reports that r's atproto-proxy header names a
// service other than the configured app view: preferences kept by another
// app view are that app view's to answer. A malformed header is the
// proxy's to refuse.
func (s *Server) preferencesElsewhere(r *http.Request) bool {
	h := r.Header.Get("Atproto-Proxy")
	if h == "" || s.proxy == nil {
		return false
	}
	did, service, err := proxy.ParseHeader(h)
	return err != nil || did.String() != s.cfg.AppViewDID || service != "bsky_appview"
}

// handleGetPreferences answers for the session's account; a deactivated
// or taken-down one too (a move copies preferences to the new, still
// deactivated account and reads them from the old one).
func (s *Server) handleGetPreferences(w http.ResponseWriter, r *http.Request) error {
	if s.preferencesElsewhere(r) {
		return s.serveProxy(w, r)
	}
	a, err := s.requireAuth(r, allowDeactivated(), allowTakendown())
	if err != nil {
		return err
	}
	prefs, err := s.accounts.Preferences(r.Context(), a.DID, a.FullAccess())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, preferencesJSON(prefs))
}

func (s *Server) handlePutPreferences(w http.ResponseWriter, r *http.Request) error {
	if s.preferencesElsewhere(r) {
		return s.serveProxy(w, r)
	}
	a, err := s.requireAuth(r, allowDeactivated())
	if err != nil {
		return err
	}
	var in struct {
		Preferences []json.RawMessage `json:"preferences"`
	}
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if in.Preferences == nil {
		return InvalidRequest("preferences is required")
	}
	prefs, err := checkPreferences(in.Preferences)
	if err != nil {
		return err
	}
	if err := s.accounts.PutPreferences(r.Context(), a.DID, prefs, a.FullAccess()); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// checkPreferences checks each preference against the atproto data model
// (no floats, well-formed $link/$bytes/blobs) and the whole list against
// app.bsky.actor.defs#preferences (known types validated, unknown ones
// accepted, as the lexicon's open union says), and returns them with
// their $type.
func checkPreferences(raw []json.RawMessage) ([]account.Preference, error) {
	if len(raw) > account.MaxPreferences {
		return nil, InvalidRequest("%d preferences: the limit is %d", len(raw), account.MaxPreferences)
	}
	prefs := make([]account.Preference, 0, len(raw))
	items := make([]any, 0, len(raw))
	for i, b := range raw {
		v, err := atdata.UnmarshalJSON(b)
		if err != nil {
			return nil, InvalidRequest("preference %d is not a valid atproto object: %v", i, err)
		}
		typ, _ := v["$type"].(string)
		if typ == "" {
			return nil, InvalidRequest("preference %d is missing a $type", i)
		}
		prefs = append(prefs, account.Preference{Type: typ, Value: b})
		items = append(items, v)
	}
	cat, err := preferencesCatalog()
	if err != nil {
		return nil, err
	}
	data := map[string]any{"$type": preferencesCheckNSID, "preferences": items}
	if err := lexicon.ValidateRecord(cat, data, preferencesCheckNSID, 0); err != nil {
		return nil, InvalidRequest("invalid preferences: %v", err)
	}
	return prefs, nil
}

// handleAdminGetPreferences answers io.github.bulwark-pds.admin.
// getPreferences?did=: every preference of the account, personalDetailsPref
// included, as the account's own full-access session would read them (for
// `bulwark admin account export`).
func (s *Server) handleAdminGetPreferences(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	if err := p.Err(); err != nil {
		return err
	}
	if _, err := s.accounts.Get(r.Context(), did); err != nil {
		return err
	}
	prefs, err := s.accounts.Preferences(r.Context(), did, true)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, preferencesJSON(prefs))
}

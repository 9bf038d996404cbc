package pds

import (
	"embed"
	"fmt"
	"sync"

	"github.com/bluesky-social/indigo/atproto/lexicon"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// lexiconFS holds the app.bsky.* and com.atproto.* schemas, copied verbatim
// from indigo's lexicons/ folder (same version as go.mod). Records of these
// collections are validated on write; others are stored unvalidated, as the
// reference PDS does.
//
//go:embed lexicons
var lexiconFS embed.FS

var (
	catalogOnce sync.Once
	catalog     *lexicon.BaseCatalog
	catalogErr  error
)

// lexicons returns the schema catalog, loaded once per process (it is
// read-only afterwards, so servers share it).
func lexicons() (*lexicon.BaseCatalog, error) {
	catalogOnce.Do(func() {
		c := lexicon.NewBaseCatalog()
		if err := c.LoadEmbedFS(lexiconFS); err != nil {
			catalogErr = fmt.Errorf("loading embedded lexicons: %w", err)
			return
		}
		catalog = c
	})
	return catalog, catalogErr
}

// Validation statuses reported by the repo write methods.
const (
	validationValid   = "valid"
	validationUnknown = "unknown"
)

// validateRecord applies the lexicon for collection to rec. validate is the
// request's flag: nil (unset) validates known collections and passes
// unknown ones; true requires a known collection; false skips validation.
// It returns the validationStatus to report: "valid", "unknown" (not
// validated: no schema), or "" when the client turned validation off (the
// reference PDS then omits the field).
func validateRecord(collection syntax.NSID, rec map[string]any, validate *bool) (string, error) {
	if validate != nil && !*validate {
		return "", nil
	}
	cat, err := lexicons()
	if err != nil {
		return "", err
	}
	if _, err := cat.Resolve(collection.String()); err != nil {
		if validate != nil && *validate {
			return "", InvalidRequest("cannot validate %s: no lexicon is known for that collection (send validate=false to store it unvalidated)", collection)
		}
		return validationUnknown, nil
	}
	if err := lexicon.ValidateRecord(cat, rec, collection.String(), 0); err != nil {
		return "", InvalidRequest("invalid %s record: %v", collection, err)
	}
	return validationValid, nil
}

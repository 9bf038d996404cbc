// Package plctest is a small PLC directory for tests and local development.
// It really verifies every submitted operation with go-didplc's log
// validation (signature by an allowed rotation key, prev chain, genesis
// DID), and serves what clients and the PDS read: the DID document at
// /{did}, the current data at /{did}/data, and the logs at /{did}/log,
// /{did}/log/last and /{did}/log/audit. Its logs live in a Store: memory,
// a JSON-lines file (`bulwark dev-plc`), or Postgres (the development PLC
// `bulwark serve` runs for a local host name).
//
// It is not a production directory: no rate limits, no export, no
// nullification window beyond what go-didplc enforces.
package plctest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
)

// maxOpBytes bounds a submitted operation, as the real directory does.
const maxOpBytes = 64 << 10

// Errors.
var (
	// ErrInvalidOperation means the directory refused an operation: not a
	// did:plc, a bad signature, a broken prev chain, a tombstoned DID.
	// Nothing was stored.
	ErrInvalidOperation = errors.New("plctest: invalid operation")
	// ErrConflict means another writer appended to the DID's log between
	// reading it and appending; nothing was stored and a retry may work.
	ErrConflict = errors.New("plctest: concurrent update of the DID's log")
)

// Directory is a verifying PLC directory over a Store.
type Directory struct {
	store Store
	mu    sync.Mutex // serialises this directory's submissions
	last  time.Time  // time of the last accepted operation
	// mux routes the HTTP API; patterns are its patterns (Patterns).
	mux      *http.ServeMux
	patterns []string
}

// NewDirectory returns a directory over store.
func NewDirectory(store Store) *Directory {
	d := &Directory{store: store, mux: http.NewServeMux()}
	d.routes()
	return d
}

// New returns an empty in-memory directory.
func New() *Directory {
	return NewDirectory(NewMemoryStore())
}

// Open returns a directory persisted to a JSON-lines file (OpenFileStore).
func Open(path string) (*Directory, error) {
	s, err := OpenFileStore(path)
	if err != nil {
		return nil, err
	}
	return NewDirectory(s), nil
}

// Store returns the directory's store.
func (d *Directory) Store() Store { return d.store }

// Close closes the store, if it needs closing (a file store does).
func (d *Directory) Close() error {
	if c, ok := d.store.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// NewServer starts an in-memory directory on a loopback httptest server,
// closed at the end of the test.
func NewServer(t interface{ Cleanup(func()) }) (*Directory, *httptest.Server) {
	d := New()
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	return d, srv
}

// Submit is SubmitContext without a deadline.
func (d *Directory) Submit(did string, op didplc.OpEnum) error {
	return d.SubmitContext(context.Background(), did, op)
}

// SubmitContext verifies op as the next operation of did's log and
// appends it. A refusal is ErrInvalidOperation; a lost race with another
// directory on the same store is ErrConflict.
func (d *Directory) SubmitContext(ctx context.Context, did string, op didplc.OpEnum) error {
	if _, err := syntax.ParseDID(did); err != nil || !strings.HasPrefix(did, "did:plc:") {
		return fmt.Errorf("%w: not a did:plc: %q", ErrInvalidOperation, did)
	}
	o := op.AsOperation()
	if o == nil {
		return fmt.Errorf("%w: empty operation", ErrInvalidOperation)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	prev, err := d.store.Log(ctx, did)
	if err != nil {
		return err
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	if !now.After(d.last) {
		now = d.last.Add(time.Millisecond)
	}
	entry := didplc.LogEntry{
		DID:       did,
		Operation: op,
		CID:       o.CID().String(),
		CreatedAt: now.Format(createdAtLayout),
	}
	if len(prev) > 0 {
		head := prev[len(prev)-1]
		if _, tomb := head.Operation.AsOperation().(*didplc.TombstoneOp); tomb {
			return fmt.Errorf("%w: DID is tombstoned", ErrInvalidOperation)
		}
		if o.PrevCIDStr() != head.CID {
			// A fork (nullification) is legal in PLC but never made by
			// Bulwark; refusing it keeps this directory simple.
			return fmt.Errorf("%w: prev %q is not the head %s", ErrInvalidOperation, o.PrevCIDStr(), head.CID)
		}
	}
	candidate := append(append([]didplc.LogEntry(nil), prev...), entry)
	if err := didplc.VerifyOpLog(candidate); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOperation, err)
	}
	if err := d.store.Append(ctx, len(prev), entry); err != nil {
		return err
	}
	d.last = now
	return nil
}

// Log returns did's operations, oldest first, or none if the store
// fails: it is for tests over the memory and file stores, which cannot.
// Use Store().Log where a failure matters.
func (d *Directory) Log(did string) []didplc.LogEntry {
	log, _ := d.store.Log(context.Background(), did)
	return log
}

// Count returns how many DIDs the directory holds, or 0 if the store
// fails (see Log).
func (d *Directory) Count() int {
	n, _ := d.store.Count(context.Background())
	return n
}

// routes registers the directory's HTTP API. Reads are open to browsers
// (CORS), as the real directory's are.
func (d *Directory) routes() {
	handle := func(pattern string, h http.HandlerFunc) {
		d.patterns = append(d.patterns, pattern)
		d.mux.HandleFunc(pattern, h)
	}
	version := func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "bulwark-plctest"})
	}
	handle("GET /{$}", version)
	handle("GET /_health", version)
	handle("POST /{did}", func(w http.ResponseWriter, r *http.Request) { d.serveSubmit(w, r, r.PathValue("did")) })
	for _, rest := range []string{"", "data", "log", "log/last", "log/audit"} {
		handle("GET "+strings.TrimSuffix("/{did}/"+rest, "/"), func(w http.ResponseWriter, r *http.Request) {
			d.serveRead(w, r, r.PathValue("did"), rest)
		})
	}
	handle("OPTIONS /", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Methods", "GET, HEAD, POST")
		w.Header().Set("Access-Control-Allow-Headers", "Content-Type")
		w.WriteHeader(http.StatusNoContent)
	})
	handle("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeError(w, http.StatusMethodNotAllowed, "method not allowed")
			return
		}
		writeError(w, http.StatusNotFound, "not found")
	})
}

// Patterns lists the http.ServeMux patterns of the HTTP API.
func (d *Directory) Patterns() []string { return append([]string(nil), d.patterns...) }

// ServeHTTP implements the directory's HTTP API.
func (d *Directory) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Access-Control-Allow-Origin", "*")
	d.mux.ServeHTTP(w, r)
}

func (d *Directory) serveSubmit(w http.ResponseWriter, r *http.Request, did string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxOpBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var op didplc.OpEnum
	if err := json.Unmarshal(body, &op); err != nil {
		writeError(w, http.StatusBadRequest, "malformed operation: "+err.Error())
		return
	}
	switch err := d.SubmitContext(r.Context(), did, op); {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]string{})
	case errors.Is(err, ErrInvalidOperation):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "storing the operation failed")
	}
}

func (d *Directory) serveRead(w http.ResponseWriter, r *http.Request, did, rest string) {
	if _, err := syntax.ParseDID(did); err != nil || !strings.HasPrefix(did, "did:plc:") {
		writeError(w, http.StatusNotFound, "not a did:plc")
		return
	}
	log, err := d.store.Log(r.Context(), did)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "reading the log failed")
		return
	}
	if len(log) == 0 {
		writeError(w, http.StatusNotFound, "DID not registered: "+did)
		return
	}
	lastOp := log[len(log)-1].Operation.AsOperation()
	switch rest {
	case "":
		if _, tomb := lastOp.(*didplc.TombstoneOp); tomb {
			writeError(w, http.StatusGone, "DID not available: "+did)
			return
		}
		doc, err := lastOp.Doc(did)
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, struct {
			Context []string `json:"@context"`
			didplc.Doc
		}{[]string{"https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1", "https://w3id.org/security/suites/secp256k1-2019/v1"}, doc})
	case "data":
		reg, ok := lastOp.(*didplc.RegularOp)
		if !ok {
			writeError(w, http.StatusGone, "DID not available: "+did)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"did":                 did,
			"verificationMethods": reg.VerificationMethods,
			"rotationKeys":        reg.RotationKeys,
			"alsoKnownAs":         reg.AlsoKnownAs,
			"services":            reg.Services,
		})
	case "log":
		ops := make([]didplc.OpEnum, len(log))
		for i, e := range log {
			ops[i] = e.Operation
		}
		writeJSON(w, http.StatusOK, ops)
	case "log/last":
		writeJSON(w, http.StatusOK, &log[len(log)-1].Operation)
	case "log/audit":
		writeJSON(w, http.StatusOK, log)
	default:
		writeError(w, http.StatusNotFound, "not found")
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"message":"encoding failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"message": msg})
}

// Package plctest is a small PLC directory for tests and local development.
// It keeps operation logs in memory (optionally mirrored to a file), really
// verifies every submitted operation with go-didplc's log validation
// (signature by an allowed rotation key, prev chain, genesis DID), and
// serves what clients and the PDS read: the DID document at /{did}, the
// current data at /{did}/data, and the logs at /{did}/log, /{did}/log/last
// and /{did}/log/audit.
//
// It is not a production directory: no rate limits, no export, no
// nullification window beyond what go-didplc enforces.
package plctest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
)

// maxOpBytes bounds a submitted operation, as the real directory does.
const maxOpBytes = 64 << 10

// Directory is an in-memory PLC directory.
type Directory struct {
	mu   sync.Mutex
	logs map[string][]didplc.LogEntry
	last time.Time
	file *os.File // nil: memory only
}

// New returns an empty in-memory directory.
func New() *Directory {
	return &Directory{logs: map[string][]didplc.LogEntry{}}
}

// Open returns a directory persisted to path (JSON lines, one log entry
// each, appended as operations are accepted), loading what it holds.
func Open(path string) (*Directory, error) {
	d := New()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var e didplc.LogEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		d.logs[e.DID] = append(d.logs[e.DID], e)
	}
	if err := sc.Err(); err != nil {
		f.Close()
		return nil, err
	}
	d.file = f
	return d, nil
}

// Close closes the backing file, if any.
func (d *Directory) Close() error {
	if d.file != nil {
		return d.file.Close()
	}
	return nil
}

// NewServer starts d on a loopback httptest server, closed at the end of
// the test.
func NewServer(t interface{ Cleanup(func()) }) (*Directory, *httptest.Server) {
	d := New()
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	return d, srv
}

// Submit verifies op as the next operation of did's log and appends it.
func (d *Directory) Submit(did string, op didplc.OpEnum) error {
	if _, err := syntax.ParseDID(did); err != nil || !strings.HasPrefix(did, "did:plc:") {
		return fmt.Errorf("not a did:plc: %q", did)
	}
	o := op.AsOperation()
	if o == nil {
		return errors.New("empty operation")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if !now.After(d.last) {
		now = d.last.Add(time.Millisecond)
	}
	entry := didplc.LogEntry{
		DID:       did,
		Operation: op,
		CID:       o.CID().String(),
		CreatedAt: now.Format("2006-01-02T15:04:05.000Z"),
	}
	prev := d.logs[did]
	if len(prev) > 0 {
		if _, tomb := prev[len(prev)-1].Operation.AsOperation().(*didplc.TombstoneOp); tomb {
			return errors.New("DID is tombstoned")
		}
		if o.PrevCIDStr() != prev[len(prev)-1].CID {
			// A fork (nullification) is legal in PLC but never made by
			// Bulwark; refusing it keeps this directory simple.
			return fmt.Errorf("prev %q is not the head %s", o.PrevCIDStr(), prev[len(prev)-1].CID)
		}
	}
	candidate := append(append([]didplc.LogEntry(nil), prev...), entry)
	if err := didplc.VerifyOpLog(candidate); err != nil {
		return fmt.Errorf("invalid operation: %w", err)
	}
	if d.file != nil {
		b, err := json.Marshal(&entry)
		if err != nil {
			return err
		}
		if _, err := d.file.Write(append(b, '\n')); err != nil {
			return err
		}
	}
	d.logs[did] = candidate
	d.last = now
	return nil
}

// Log returns did's operations, oldest first.
func (d *Directory) Log(did string) []didplc.LogEntry {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]didplc.LogEntry(nil), d.logs[did]...)
}

// Count returns how many DIDs the directory holds.
func (d *Directory) Count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.logs)
}

// ServeHTTP implements the directory's HTTP API.
func (d *Directory) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/")
	if path == "" || path == "_health" {
		writeJSON(w, http.StatusOK, map[string]string{"version": "bulwark-plctest"})
		return
	}
	did, rest, _ := strings.Cut(path, "/")
	switch {
	case r.Method == http.MethodPost && rest == "":
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
		if err := d.Submit(did, op); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{})
		return
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	log := d.Log(did)
	if len(log) == 0 {
		writeError(w, http.StatusNotFound, "DID not registered: "+did)
		return
	}
	lastOp := log[len(log)-1].Operation.AsOperation()
	_, tomb := lastOp.(*didplc.TombstoneOp)
	switch rest {
	case "":
		if tomb {
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

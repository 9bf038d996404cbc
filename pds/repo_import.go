package pds

import (
	"context"
	"errors"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/repo"
)

// importBusyRetry is the Retry-After of an import refused because others
// are running.
const importBusyRetry = 30 * time.Second

// minImportSlots is the fewest imports a process runs at once when
// Config.ImportSlots leaves it to the pool's size.
const minImportSlots = 2

// registerImportRoutes registers com.atproto.repo.importRepo and its admin
// variant. Both stream the CAR (up to Config.MaxImportSize) into the
// repository engine, which stages it in the database rather than memory,
// and share the import slots. The body is held to Config.ImportMinRate
// and must be in within Config.ImportDeadline: a slot is held (with a
// database connection) until it is.
func (s *Server) registerImportRoutes() {
	if s.repo == nil || s.accounts == nil {
		return
	}
	gate := newImportGate(s.importSlots())
	rule := bodyRate{grace: s.bodyRate.grace, rate: s.cfg.ImportMinRate, limit: s.cfg.ImportDeadline}
	opts := []methodOption{withMaxBody(s.cfg.MaxImportSize), longRunning(), withBodyRate(rule)}
	s.procedure("com.atproto.repo.importRepo", func(w http.ResponseWriter, r *http.Request) error {
		return s.handleImportRepo(w, r, gate)
	}, opts...)
	s.procedure(AdminNSIDPrefix+"importRepo", s.admin(func(w http.ResponseWriter, r *http.Request) error {
		return s.handleAdminImportRepo(w, r, gate)
	}), opts...)
}

// importSlots is Config.ImportSlots, or a quarter of the database pool
// (at least minImportSlots) when that is 0.
func (s *Server) importSlots() int {
	if s.cfg.ImportSlots > 0 {
		return s.cfg.ImportSlots
	}
	return max(minImportSlots, int(s.db.Config().MaxConns)/4)
}

// importGate holds a slot per import running, and at most one per
// account: an account's second import would only replace its first, and
// must not take a slot another account's migration needs.
type importGate struct {
	slots   chan struct{}
	mu      sync.Mutex
	running map[syntax.DID]bool // at most cap(slots) entries
}

func newImportGate(slots int) *importGate {
	return &importGate{slots: make(chan struct{}, slots), running: map[syntax.DID]bool{}}
}

// enter takes a slot for did, or refuses at once: 429 when did already
// imports, 503 when all slots are taken. A client waiting would hold its
// connection and body for nothing. The caller has authenticated the
// request, so that callers without the right to import cannot fill the
// slots.
func (g *importGate) enter(did syntax.DID) (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running[did] {
		return nil, RateLimitExceeded(importBusyRetry, "a repository import into %s is already running; an account imports one at a time", did)
	}
	select {
	case g.slots <- struct{}{}:
	default:
		return nil, ServiceOverloaded(importBusyRetry, "%d repository imports are running; retry later", cap(g.slots))
	}
	g.running[did] = true
	return func() {
		g.mu.Lock()
		delete(g.running, did)
		g.mu.Unlock()
		<-g.slots
	}, nil
}

// busy reports whether did has an import running.
func (g *importGate) busy(did syntax.DID) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running[did]
}

// checkCARBody refuses a body declared as something other than a CAR. A
// body without a Content-Type is read as one.
func checkCARBody(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != carContentType {
		return InvalidRequest("request body must be %s, not %q", carContentType, ct)
	}
	return nil
}

// importOptions are the server's import settings.
func (s *Server) importOptions() repo.ImportOptions {
	return repo.ImportOptions{MaxBytes: s.cfg.MaxImportSize, AllowOversize: s.cfg.ImportAllowOversize}
}

// handleImportRepo answers com.atproto.repo.importRepo: the caller's own
// repository is replaced by the one in the CAR body, which is how an
// account migrating here brings its data (into the new, deactivated
// account). The session must be made with the account password, not an
// app password. Whatever the repository held before is replaced whole;
// the import is announced as #sync. The answer has no body, as the
// lexicon says.
func (s *Server) handleImportRepo(w http.ResponseWriter, r *http.Request, gate *importGate) error {
	a, err := s.requireAuth(r, allowDeactivated(), fullAccessOnly(), oauthAccount("repo", oauth.ActionManage))
	if err != nil {
		return err
	}
	if err := checkCARBody(r); err != nil {
		return err
	}
	leave, err := gate.enter(a.DID)
	if err != nil {
		return err
	}
	defer leave()
	// Counted once a slot is taken: a refusal for a busy server costs the
	// client nothing, a started import does.
	if err := s.limitDID(w, ratelimit.PolicyImportRepo, a.DID); err != nil {
		return err
	}
	res, err := s.repo.Import(r.Context(), a.DID, r.Body, s.importOptions())
	if err != nil {
		return err
	}
	s.logger.Info("repository imported", "did", a.DID, "rev", res.Rev, "records", res.Records,
		"bytes", res.Bytes, "request_id", RequestID(r.Context()))
	w.WriteHeader(http.StatusOK)
	return nil
}

// adminImportOutput reports an admin import.
type adminImportOutput struct {
	DID      string `json:"did"`
	Commit   string `json:"commit"`
	Rev      string `json:"rev"`
	Records  int64  `json:"records"`
	Blocks   int64  `json:"blocks"`
	Bytes    int64  `json:"bytes"`
	BlobRefs int64  `json:"blobRefs"`
	// Oversize counts records over the per-record limits that were
	// stored (the server allows them).
	Oversize int `json:"oversize,omitempty"`
}

// handleAdminImportRepo answers io.github.bulwark-pds.admin.importRepo:
// importRepo into the account ?did=, whatever its status (an operator
// restoring a backup), with an audit entry written in the import's
// transaction. It answers what was imported.
func (s *Server) handleAdminImportRepo(w http.ResponseWriter, r *http.Request, gate *importGate) error {
	p := queryParams(r)
	did := p.did("did")
	reason := p.optional("reason")
	if err := p.Err(); err != nil {
		return err
	}
	if len(reason) > maxAdminRefLen {
		return InvalidRequest("reason is longer than %d bytes", maxAdminRefLen)
	}
	if err := checkCARBody(r); err != nil {
		return err
	}
	before, err := s.repo.GetHead(r.Context(), did)
	if errors.Is(err, repo.ErrRepoNotFound) {
		return subjectNotFound("no repository for %s on this server", did)
	}
	if err != nil {
		return err
	}
	leave, err := gate.enter(did)
	if err != nil {
		return err
	}
	defer leave()
	opts := s.importOptions()
	action := AdminNSIDPrefix + "importRepo"
	opts.InTx = func(ctx context.Context, tx db.DBTX, res *repo.ImportResult) error {
		return audit.Record(ctx, tx, &audit.Entry{
			Actor: adminActor, Action: action, Subject: did.String(), Reason: reason,
			Before: map[string]any{"commit": before.Commit.String(), "rev": before.Rev},
			After:  map[string]any{"commit": res.Commit.String(), "rev": res.Rev, "records": res.Records, "bytes": res.Bytes},
		})
	}
	res, err := s.repo.Import(r.Context(), did, r.Body, opts)
	if err != nil {
		return err
	}
	s.logger.Info("admin write", "method", action, "subject", did, "request_id", RequestID(r.Context()))
	return writeJSON(w, http.StatusOK, adminImportOutput{
		DID: did.String(), Commit: res.Commit.String(), Rev: res.Rev, Records: res.Records,
		Blocks: res.Blocks, Bytes: res.Bytes, BlobRefs: res.BlobRefs, Oversize: res.OversizeTotal,
	})
}

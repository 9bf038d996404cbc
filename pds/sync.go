package pds

import (
	"bufio"
	"context"
	_ "embed"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"golang.org/x/time/rate"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/fastsyntax"
	"github.com/bulwark-pds/bulwark/priority"
	"github.com/bulwark-pds/bulwark/repo"
)

// com.atproto.sync reads: what relays and app views fall back to when they
// lose track of a repository. All of them are public (no auth) and cheap to
// refuse: the account's status is checked before any block is read.

// Limits of the sync methods.
const (
	// MaxGetBlocks bounds the CIDs one getBlocks call may ask for: the
	// lexicon sets none, and each CID is a database lookup held in memory
	// until the CAR is sent.
	MaxGetBlocks = 1000
	// streamWriteTimeout is how long one write of a streamed response
	// (getRepo, getBlob) may take before the client is dropped: a client
	// that stops reading must not hold a snapshot and a connection open.
	streamWriteTimeout = 30 * time.Second
	// streamBuffer is how much of a CAR export is gathered before a write
	// to the socket.
	streamBuffer = 64 << 10
	// carContentType is the media type of CAR responses.
	carContentType = "application/vnd.ipld.car"
)

// RepoDeactivated is the 400 the sync lexicons specify for a deactivated
// account's repository.
func RepoDeactivated(format string, args ...any) *XRPCError {
	return newError(http.StatusBadRequest, "RepoDeactivated", format, args...)
}

// RepoTakendown is the 400 the sync lexicons specify for a taken-down
// account's repository.
func RepoTakendown(format string, args ...any) *XRPCError {
	return newError(http.StatusBadRequest, "RepoTakendown", format, args...)
}

// BlockNotFound is the 400 of getBlocks for a CID the repository does not
// hold.
func BlockNotFound(format string, args ...any) *XRPCError {
	return newError(http.StatusBadRequest, "BlockNotFound", format, args...)
}

// BlobNotFound is the 400 for a blob the account does not have (getBlob)
// or a record that refers to a blob never uploaded.
func BlobNotFound(format string, args ...any) *XRPCError {
	return newError(http.StatusBadRequest, "BlobNotFound", format, args...)
}

// repoStatus is what the sync methods need to know about a repository
// before serving it.
type repoStatus struct {
	// status is the account's status (active, deactivated, takendown).
	status account.Status
	head   *repo.Head
}

func (st *repoStatus) active() bool { return st.status == account.StatusActive }

// lookupRepo returns did's repository and account status. A DID with
// neither an account nor a repository is RepoNotFound.
func (s *Server) lookupRepo(ctx context.Context, did syntax.DID) (*repoStatus, error) {
	st := &repoStatus{status: account.StatusActive}
	if s.accounts != nil {
		status, err := s.accounts.Status(ctx, did)
		switch {
		case errors.Is(err, account.ErrAccountNotFound):
			return nil, RepoNotFound("could not find repo for DID: %s", did)
		case err != nil:
			return nil, err
		}
		st.status = status
	}
	head, err := s.repo.GetHead(ctx, did)
	if errors.Is(err, repo.ErrRepoNotFound) {
		return nil, RepoNotFound("could not find repo for DID: %s", did)
	}
	if err != nil {
		return nil, err
	}
	st.head = head
	return st, nil
}

// availableRepo is lookupRepo for methods that serve a repository's
// contents: a deactivated or taken-down account's repository is refused
// with the reference PDS's errors.
func (s *Server) availableRepo(ctx context.Context, did syntax.DID) (*repoStatus, error) {
	st, err := s.lookupRepo(ctx, did)
	if err != nil {
		return nil, err
	}
	return st.servable(did)
}

// servable returns st when its account is active, else the refusal the
// sync lexicons name.
func (st *repoStatus) servable(did syntax.DID) (*repoStatus, error) {
	switch st.status {
	case account.StatusActive:
		return st, nil
	case account.StatusDeactivated:
		return nil, RepoDeactivated("repo has been deactivated: %s", did)
	case account.StatusTakendown:
		return nil, RepoTakendown("repo has been taken down: %s", did)
	default:
		return nil, RepoNotFound("could not find repo for DID: %s", did)
	}
}

// handleGetRepo answers com.atproto.sync.getRepo: the whole repository (or
// the blocks written after ?since) as a CAR, streamed from one database
// snapshot so the server's memory does not grow with the repository.
func (s *Server) handleGetRepo(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	since := p.optional("since")
	if err := p.Err(); err != nil {
		return err
	}
	if since != "" {
		if _, err := syntax.ParseTID(since); err != nil {
			return InvalidRequest("parameter \"since\" must be a repo rev (a TID): %v", err)
		}
	}
	return s.exportRepo(w, r, did, since)
}

// handleGetCheckout answers com.atproto.sync.getCheckout (deprecated, still
// called by older tools): the whole repository as a CAR, exactly what
// getRepo without since answers, under the same bounds.
func (s *Server) handleGetCheckout(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	if err := p.Err(); err != nil {
		return err
	}
	return s.exportRepo(w, r, did, "")
}

// handleGetHead answers com.atproto.sync.getHead (deprecated): the CID of
// the repository's current commit, with getLatestCommit's availability
// rules.
func (s *Server) handleGetHead(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	if err := p.Err(); err != nil {
		return err
	}
	st, err := s.availableRepoFor(r, did)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]string{"root": st.head.Commit.String()})
}

// exportRepo streams did's repository (the blocks written after since,
// when set) as a CAR: from the cache when whole, else from one database
// snapshot.
func (s *Server) exportRepo(w http.ResponseWriter, r *http.Request, did syntax.DID, since string) error {
	if since == "" && s.carCache != nil {
		return s.serveCachedRepo(w, r, did)
	}
	release, gerr := s.guardExport(r.Context())
	if gerr != nil {
		return gerr
	}
	defer release()
	if _, err := s.availableRepoFor(r, did); err != nil {
		return err
	}
	f, size, err := s.spoolExport(r.Context(), did, since)
	if err != nil {
		return err
	}
	defer f.Close()
	return s.sendCARFile(w, r, f, size)
}

// spoolExport exports did's repository (only what changed after since,
// when set) into an unlinked temporary file and returns it rewound, with
// its size. The export's transaction, and the pooled connection and
// snapshot it holds, end before a byte goes to the client: a client that
// reads slowly, or not at all, holds no database connection (the CAR
// cache does the same for whole-repository answers).
func (s *Server) spoolExport(ctx context.Context, did syntax.DID, since string) (*os.File, int64, error) {
	dir := ""
	if s.carCache != nil {
		dir = s.carCache.dir
	}
	f, err := os.CreateTemp(dir, "export-")
	if err != nil {
		return nil, 0, err
	}
	// Unlinked at once: the file goes with its last close, whatever
	// happens to the request or the process.
	_ = os.Remove(f.Name())
	bw := bufio.NewWriterSize(f, streamBuffer)
	err = s.repo.ExportCAR(ctx, did, since, bw)
	if err == nil {
		err = bw.Flush()
	}
	var size int64
	if err == nil {
		size, err = f.Seek(0, io.SeekCurrent)
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, size, nil
}

// exportWriter is the stream writer of a CAR export: background work (it
// gives way to writes in flight, package priority), its bytes drawn from
// the server's export rate (cfg.ExportRate bytes a second for all getRepo
// answers together).
func (s *Server) exportWriter(w http.ResponseWriter, r *http.Request) *streamWriter {
	sw := newStreamWriter(w)
	// An export is background work: before each chunk it gives way to
	// writes in flight (for a bounded pause), and while it waits the
	// export itself (the database reads that fill the buffer) waits too.
	sw.background(r.Context(), s.priority)
	sw.pace(s.exportRate)
	return sw
}

// carCacheBuildTimeout bounds one export into the CAR cache.
const carCacheBuildTimeout = 10 * time.Minute

// serveCachedRepo answers a whole-repository getRepo from the CAR cache,
// exporting into it first when the repository has moved on since (holding
// an export slot, as an uncached export does, for that part only).
// Serving a cached file takes a served-export slot, not a database one.
func (s *Server) serveCachedRepo(w http.ResponseWriter, r *http.Request, did syntax.DID) error {
	ctx := r.Context()
	// The slot first: a refusal must cost no database work.
	release, err := budget.Guard(ctx, s.protect.cachedExports, 1)
	if err != nil {
		return err
	}
	defer release()
	st, err := s.availableRepoFor(r, did)
	if err != nil {
		return err
	}
	commit := st.head.Commit.String()
	f, size := s.carCache.open(did.String(), commit)
	if f == nil {
		releaseExport, err := s.guardExport(ctx)
		if err != nil {
			return err
		}
		// The export fills the cache for everyone asking: it is not
		// abandoned if this client goes away.
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), carCacheBuildTimeout)
		defer cancel()
		f, size, err = s.carCache.build(ctx, did.String(), commit, func(out io.Writer) error {
			bw := bufio.NewWriterSize(out, streamBuffer)
			if err := s.repo.ExportCAR(bctx, did, "", bw); err != nil {
				return err
			}
			return bw.Flush()
		})
		releaseExport()
		if err != nil {
			return err
		}
	}
	defer f.Close()
	return s.sendCARFile(w, r, f, size)
}

// sendCARFile answers with the CAR in f (size bytes), paced and bounded as
// every export is.
func (s *Server) sendCARFile(w http.ResponseWriter, r *http.Request, f *os.File, size int64) error {
	w.Header().Set("Content-Type", carContentType)
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	if r.Method == http.MethodHead {
		return nil
	}
	sw := s.exportWriter(w, r)
	buf := make([]byte, streamBuffer)
	// The file is copied through buf, one stream chunk per write (a bare
	// *os.File would pick its own copy and chunk size).
	if _, err := io.CopyBuffer(sw, struct{ io.Reader }{f}, buf); err != nil {
		return s.endStream(r, sw, err)
	}
	return nil
}

// handleGetLatestCommit answers com.atproto.sync.getLatestCommit.
func (s *Server) handleGetLatestCommit(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	if err := p.Err(); err != nil {
		return err
	}
	st, err := s.availableRepoFor(r, did)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, comatproto.SyncGetLatestCommit_Output{Cid: st.head.Commit.String(), Rev: st.head.Rev})
}

// handleSyncGetRecord answers com.atproto.sync.getRecord: a CAR proving the
// record's presence (commit, MST path, record) or its absence (commit and
// the MST path to where it would be), as the lexicon describes.
func (s *Server) handleSyncGetRecord(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	rawColl := p.required("collection")
	rawRKey := p.required("rkey")
	if err := p.Err(); err != nil {
		return err
	}
	coll, err := fastsyntax.ParseNSID(rawColl)
	if err != nil {
		return InvalidRequest("parameter \"collection\": %v", err)
	}
	rkey, err := fastsyntax.ParseRecordKey(rawRKey)
	if err != nil {
		return InvalidRequest("parameter \"rkey\": %v", err)
	}
	// The proof's fixed part first, so that a refusal costs no database
	// work; then the record's own bytes once its size is known (the
	// record is not read for that).
	res, err := s.reserve(r.Context(), proofReserve)
	if err != nil {
		return err
	}
	defer func() { res.Release() }()
	if _, err := s.availableRepoFor(r, did); err != nil {
		return err
	}
	size, err := s.repo.RecordSize(r.Context(), did, coll, rkey)
	if err != nil {
		return err
	}
	if res, err = s.reserveMore(r.Context(), res, proofReserve+int64(size)*proofRecordFactor); err != nil {
		return err
	}
	if err := s.recordServable(r.Context(), did, coll, rkey); err != nil {
		return err
	}
	proof, err := s.repo.ProofCAR(r.Context(), did, coll, rkey)
	if err != nil {
		return err
	}
	return writeCAR(w, proof)
}

// listReposOutput is com.atproto.sync.listRepos's output. The indigo type
// marks status optional with omitempty already; this mirrors it with our
// own element type so that a nil slice is sent as [].
type listReposOutput struct {
	Cursor *string                          `json:"cursor,omitempty"`
	Repos  []*comatproto.SyncListRepos_Repo `json:"repos"`
}

// handleListRepos answers com.atproto.sync.listRepos, paginated by DID.
func (s *Server) handleListRepos(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	limit := p.intParam("limit", 500, 1, 1000)
	cursor := p.optional("cursor")
	if err := p.Err(); err != nil {
		return err
	}
	repos, err := account.ListRepos(r.Context(), s.db, cursor, int(limit))
	if err != nil {
		return err
	}
	out := listReposOutput{Repos: make([]*comatproto.SyncListRepos_Repo, 0, len(repos))}
	for _, hr := range repos {
		item := &comatproto.SyncListRepos_Repo{Did: hr.DID.String(), Head: hr.Head.String(), Rev: hr.Rev}
		st := string(hr.Status)
		if st == "" {
			// No account row. With accounts, getRepo answers RepoNotFound
			// for such a repository, so it is listed as deleted.
			st = string(account.StatusActive)
			if s.accounts != nil {
				st = string(account.StatusDeleted)
			}
		}
		active := st == string(account.StatusActive)
		item.Active = &active
		if !active {
			item.Status = &st
		}
		out.Repos = append(out.Repos, item)
	}
	if int64(len(out.Repos)) == limit {
		last := out.Repos[len(out.Repos)-1].Did
		out.Cursor = &last
	}
	return writeJSON(w, http.StatusOK, out)
}

// handleGetRepoStatus answers com.atproto.sync.getRepoStatus. Unlike the
// content methods it answers for deactivated and taken-down accounts too:
// saying so is its purpose.
func (s *Server) handleGetRepoStatus(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	if err := p.Err(); err != nil {
		return err
	}
	st, err := s.lookupRepo(r.Context(), did)
	if err != nil {
		return err
	}
	out := comatproto.SyncGetRepoStatus_Output{Did: did.String(), Active: st.active()}
	if st.active() {
		out.Rev = &st.head.Rev
	} else {
		status := string(st.status)
		out.Status = &status
	}
	return writeJSON(w, http.StatusOK, out)
}

type listBlobsOutput struct {
	Cursor *string  `json:"cursor,omitempty"`
	Cids   []string `json:"cids"`
}

// handleListBlobs answers com.atproto.sync.listBlobs: the blobs the
// account's records refer to, optionally only those of records written
// after ?since, in CID order.
func (s *Server) handleListBlobs(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	since := p.optional("since")
	limit := p.intParam("limit", 500, 1, 1000)
	cursor := p.optional("cursor")
	if err := p.Err(); err != nil {
		return err
	}
	if since != "" {
		if _, err := syntax.ParseTID(since); err != nil {
			return InvalidRequest("parameter \"since\" must be a repo rev (a TID): %v", err)
		}
	}
	if _, err := s.availableRepoFor(r, did); err != nil {
		return err
	}
	cids, next, err := s.blobs.ListBlobs(r.Context(), did, since, cursor, int(limit))
	if err != nil {
		return err
	}
	out := listBlobsOutput{Cids: cids}
	if out.Cids == nil {
		out.Cids = []string{}
	}
	if next != "" {
		out.Cursor = &next
	}
	return writeJSON(w, http.StatusOK, out)
}

// handleGetBlob answers com.atproto.sync.getBlob. The bytes are served
// under the MIME type sniffed at upload, never interpreted by a browser as
// anything else (nosniff) and never able to run script or load anything in
// this origin (the CSP sandbox), whatever an uploader put in them. Range
// requests and conditional requests (ETag = the CID, which never changes)
// are handled by http.ServeContent; HEAD takes the same path as GET.
func (s *Server) handleGetBlob(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	rawCID := p.required("cid")
	if err := p.Err(); err != nil {
		return err
	}
	c, err := cid.Decode(rawCID)
	if err != nil {
		return InvalidRequest("parameter \"cid\": %q is not a CID: %v", rawCID, err)
	}
	release, err := s.guard(r.Context(), blobReserve)
	if err != nil {
		return err
	}
	defer release()
	if _, err := s.availableRepoFor(r, did); err != nil {
		return err
	}
	if err := s.blobServable(r.Context(), did, c); err != nil {
		return err
	}
	b, rc, err := s.blobs.Open(r.Context(), did, c)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", b.MimeType)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	h.Set("ETag", strconv.Quote(c.String()))
	// Content-addressed: the bytes under this URL never change.
	h.Set("Cache-Control", "public, max-age=31536000, immutable")
	sw := newStreamWriter(w)
	sw.background(r.Context(), s.priority)
	http.ServeContent(sw, r, "", time.Time{}, rc)
	if sw.err != nil {
		return s.endStream(r, sw, sw.err)
	}
	return nil
}

// writeCAR answers a CAR held in memory (proofs and block lists, which are
// bounded).
func writeCAR(w http.ResponseWriter, data []byte) error {
	h := w.Header()
	h.Set("Content-Type", carContentType)
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data)
	return nil
}

// carBuffer is a growable byte slice that is an io.Writer.
type carBuffer []byte

func (b *carBuffer) Write(p []byte) (int, error) {
	*b = append(*b, p...)
	return len(p), nil
}

// streamWriter is the response writer of a long-running streamed response:
// before each write it pushes the connection's write deadline forward, so a
// client that keeps reading is served however long it takes and one that
// stops is dropped after streamWriteTimeout. It remembers the first write
// error. Made background, it yields to foreground work (priority.Gate)
// before each write: the pause comes before the write deadline is set, so
// it never counts against the client.
type streamWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	started bool
	err     error
	// gate and ctx, when gate is set, make the stream background work.
	gate *priority.Gate
	ctx  context.Context
	// rate, when set, is the shared byte rate the stream draws on.
	rate *rate.Limiter
}

// pace makes the stream draw its bytes from lim (nil: unpaced). Call it
// after background, whose context the waits honour.
func (sw *streamWriter) pace(lim *rate.Limiter) { sw.rate = lim }

func newStreamWriter(w http.ResponseWriter) *streamWriter {
	return &streamWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
}

// background makes the stream yield to gate's foreground work before each
// write, until ctx (the request's) ends.
func (sw *streamWriter) background(ctx context.Context, gate *priority.Gate) {
	sw.ctx, sw.gate = ctx, gate
}

func (sw *streamWriter) Write(p []byte) (int, error) {
	if sw.err != nil {
		return 0, sw.err
	}
	if sw.gate != nil {
		if err := sw.gate.Yield(sw.ctx); err != nil {
			sw.err = err
			return 0, err
		}
	}
	if sw.rate != nil {
		if err := sw.wait(len(p)); err != nil {
			sw.err = err
			return 0, err
		}
	}
	_ = sw.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	sw.started = true
	n, err := sw.ResponseWriter.Write(p)
	if err != nil {
		sw.err = err
	}
	return n, err
}

// wait takes n bytes from the shared rate, in pieces no larger than its
// burst, waiting as needed.
func (sw *streamWriter) wait(n int) error {
	for n > 0 {
		k := min(n, sw.rate.Burst())
		if err := sw.rate.WaitN(sw.ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// WriteHeader commits the response (http.ServeContent sends its status
// first): from here on, an error can only cut the stream off.
func (sw *streamWriter) WriteHeader(code int) {
	sw.started = true
	sw.ResponseWriter.WriteHeader(code)
}

// Unwrap exposes the underlying writer to http.ResponseController.
func (sw *streamWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }

// endStream ends a streamed response that broke. Before the first byte the
// error can still be answered normally; after it, the connection is aborted
// so that the client sees a truncated transfer instead of a short response
// that looks complete.
func (s *Server) endStream(r *http.Request, sw *streamWriter, err error) error {
	if !sw.started {
		return err
	}
	level := slog.LevelWarn
	if r.Context().Err() != nil {
		level = slog.LevelDebug // the client went away
	}
	s.logger.Log(r.Context(), level, "streamed response cut off", "request_id", RequestID(r.Context()), "path", r.URL.Path, "error", err)
	panic(http.ErrAbortHandler)
}

// registerSyncRoutes registers the com.atproto.sync reads and the blob
// methods. They need the repository engine; the blob methods need the blob
// service too.
func (s *Server) registerSyncRoutes() {
	if s.repo == nil {
		return
	}
	s.query("com.atproto.sync.getRepo", s.handleGetRepo, longRunning())
	s.query("com.atproto.sync.getCheckout", s.handleGetCheckout, longRunning())
	s.query("com.atproto.sync.getHead", s.handleGetHead)
	s.query("com.atproto.sync.getLatestCommit", s.handleGetLatestCommit)
	s.query("com.atproto.sync.getRecord", s.handleSyncGetRecord)
	s.query("com.atproto.sync.getBlocks", s.handleGetBlocks)
	s.query("com.atproto.sync.listRepos", s.handleListRepos)
	s.query("com.atproto.sync.getRepoStatus", s.handleGetRepoStatus)
	if s.blobs == nil {
		return
	}
	s.query("com.atproto.sync.listBlobs", s.handleListBlobs)
	s.query("com.atproto.sync.getBlob", s.handleGetBlob, longRunning())
	s.procedure("com.atproto.repo.uploadBlob", s.handleUploadBlob, withMaxBody(s.blobs.MaxBytes()), longRunning())
	s.query("com.atproto.repo.listMissingBlobs", s.handleListMissingBlobs)
}

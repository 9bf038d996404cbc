package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// LocalState is what read-after-write needs to know of the caller's own
// repository.
type LocalState interface {
	// RepoRev returns the account's current repository revision (a TID),
	// "" when it has none.
	RepoRev(ctx context.Context, did syntax.DID) (string, error)
	// RecordsSince returns the account's app.bsky.feed.post records and
	// its app.bsky.actor.profile/self record written after rev (a TID),
	// with its handle and current profile. Nil or empty: nothing to add.
	// Like the reference PDS, it should return nothing when rev is older
	// than every local record (an account that migrated in).
	RecordsSince(ctx context.Context, did syntax.DID, rev string) (*LocalRecords, error)
}

// LocalRecords are an account's records newer than what the app view has
// seen.
type LocalRecords struct {
	// Handle is the account's handle ("" is shown as handle.invalid).
	Handle string
	// Profile is the account's current profile record, nil when it has
	// none. Spliced posts' author is built from it, changed or not.
	Profile *Record
	// ProfileChanged is true when Profile was written after the rev: only
	// then are the app view's profile views updated from it.
	ProfileChanged bool
	// Posts are the posts written after the rev, oldest first. Only the
	// newest MaxLocalPosts are used.
	Posts []Record
}

// Record is one record of the caller's repository.
type Record struct {
	// URI is at://<did>/<collection>/<rkey>.
	URI syntax.ATURI
	// CID is the record's CID.
	CID syntax.CID
	// IndexedAt is when the PDS stored it.
	IndexedAt time.Time
	// Value is the record in atproto JSON form (blobs as {"$type":
	// "blob", "ref": {"$link": …}, …}).
	Value json.RawMessage
}

// MaxLocalPosts bounds the posts spliced into one response.
const MaxLocalPosts = 25

// UpstreamLagHeader carries how far behind the upstream was (ms) when
// local records were spliced in.
const UpstreamLagHeader = "Atproto-Upstream-Lag"

// munger splices local records into a decoded response body. It reports
// whether it changed anything.
type munger func(v *viewer, body map[string]any, q url.Values) bool

// rawMethods are the app view reads whose answers get the caller's own
// recent writes.
var rawMethods = map[syntax.NSID]munger{
	"app.bsky.feed.getTimeline":   mungeTimeline,
	"app.bsky.feed.getAuthorFeed": mungeAuthorFeed,
	"app.bsky.feed.getActorLikes": mungeActorLikes,
	"app.bsky.feed.getPostThread": mungePostThread,
	"app.bsky.actor.getProfile":   mungeProfile,
	"app.bsky.actor.getProfiles":  mungeProfiles,
}

func (p *Proxy) rawEligible(r *http.Request, nsid syntax.NSID, c Caller) bool {
	return p.cfg.Local != nil && c.Authenticated && c.DID != "" &&
		r.Method == http.MethodGet && rawMethods[nsid] != nil
}

// indexingGrace is how long after a commit an app view whose
// atproto-repo-rev names that commit may still lack its posts, and those
// of the commits just before it. The reference app view stores a commit's
// revision while it indexes the commit's records, not after: for a moment
// it answers with the repository's current revision and without the post
// just written (and, now and then, without one written a moment earlier).
// For an account it has seen no commit of yet (a new account's first
// post) it sends no revision at all.
const indexingGrace = 30 * time.Second

// indexingMethods are the reads whose answers show the caller's new
// posts while the app view indexes them (a profile read shows the same
// record either way).
var indexingMethods = map[syntax.NSID]bool{
	"app.bsky.feed.getTimeline":   true,
	"app.bsky.feed.getAuthorFeed": true,
	getPostThreadNSID:             true,
}

// staleness is which of the caller's records an upstream answer may lack.
type staleness struct {
	// since: those written after this revision.
	since string
	// postsOnly: only posts (the upstream names the repository's current
	// revision, and may still be indexing the recent commits).
	postsOnly bool
	// orSince, when set, is asked for when since finds nothing: since is
	// then the start of indexingGrace, which for a repository whose first
	// commit here is more recent is not one of its revisions (and finds
	// nothing); orSince is the one before its current commit.
	orSince string
}

// behind reports whether resp, a JSON answer to nsid stamped with the
// upstream's view of the caller's repository (atproto-repo-rev), may lack
// records of the repository, and which: those written after the
// upstream's revision when it is older than the repository's; the posts
// of the last indexingGrace when the upstream names the repository's
// current commit and that is less than indexingGrace old. revOptional
// treats an answer without a revision as naming the current one (the
// configured app view's getPostThread NotFound: an app view that has seen
// no commit of the caller sends none). What the upstream already shows is
// never added twice.
func (p *Proxy) behind(ctx context.Context, resp *http.Response, did syntax.DID, nsid syntax.NSID, revOptional bool) (staleness, bool) {
	if !isJSON(resp.Header.Get("Content-Type")) {
		return staleness{}, false
	}
	rev := resp.Header.Get("Atproto-Repo-Rev")
	if _, err := syntax.ParseTID(rev); err != nil && (rev != "" || !revOptional) {
		return staleness{}, false
	}
	local, err := p.cfg.Local.RepoRev(ctx, did)
	if err != nil {
		p.logger.Warn("read-after-write: repo rev lookup failed", "did", did, "error", err)
		return staleness{}, false
	}
	if rev == "" {
		rev = local
	}
	tid, err := syntax.ParseTID(rev)
	switch {
	case err != nil:
		return staleness{}, false
	case local > rev: // TIDs sort as strings
		return staleness{since: rev}, true
	case local == rev && indexingMethods[nsid] && time.Since(tid.Time()) < indexingGrace && tid.Integer() > 0:
		before := syntax.NewTIDFromInteger(tid.Integer() - 1)
		since := syntax.NewTIDFromTime(time.Now().Add(-indexingGrace), 0)
		if since.Integer() >= before.Integer() {
			return staleness{since: before.String(), postsOnly: true}, true
		}
		return staleness{since: since.String(), postsOnly: true, orSince: before.String()}, true
	}
	return staleness{}, false
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || (len(mt) > 5 && mt[len(mt)-5:] == "+json"))
}

// readAfterWrite splices the caller's records that resp may lack into it:
// when there are any, it buffers resp (within MaxResponseBytes), splices
// them in and writes the result; otherwise, or when the answer cannot be
// read, the upstream's bytes go out unchanged.
func (ex *exchange) readAfterWrite(w http.ResponseWriter, r *http.Request, resp *http.Response, c Caller, st staleness) error {
	local := ex.p.recordsSince(r.Context(), c.DID, st)
	if local == nil {
		return ex.relay(w, r, resp)
	}
	raw, err := ex.readAll(resp.Body)
	if err != nil {
		return err
	}
	out, lag := ex.p.splice(r.Context(), raw, resp.Header.Get("Content-Encoding"), r.URL.Query(), rawMethods[ex.nsid], c, local)
	if out == nil {
		ex.writeHeader(w, resp)
		_, _ = w.Write(raw) // a failed write means the client left
		return nil
	}
	ex.writeMunged(w, resp, out, lag)
	return nil
}

// writeMunged answers 200 with out, a JSON body built here in place of
// resp's, and how far behind the upstream was; of resp's headers, those
// that still describe the answer are kept.
func (ex *exchange) writeMunged(w http.ResponseWriter, resp *http.Response, out []byte, lag time.Duration) {
	h := w.Header()
	for _, name := range []string{"Content-Language", "Atproto-Repo-Rev", "Atproto-Content-Labelers"} {
		if v := resp.Header.Values(name); len(v) > 0 {
			h[name] = append([]string(nil), v...)
		}
	}
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	h.Set(UpstreamLagHeader, strconv.FormatInt(lag.Milliseconds(), 10))
	ex.status = http.StatusOK
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out) // a failed write means the client left
}

// readAll reads a whole upstream body under the watchdog, within
// MaxResponseBytes.
func (ex *exchange) readAll(body io.Reader) ([]byte, error) {
	limit := ex.p.cfg.MaxResponseBytes
	var buf bytes.Buffer
	chunk := make([]byte, copyBufferSize)
	for {
		n, err := ex.read(body, chunk)
		if int64(buf.Len()+n) > limit {
			return nil, ex.tooLarge()
		}
		buf.Write(chunk[:n])
		if err == io.EOF {
			return buf.Bytes(), nil
		}
		if err != nil {
			return nil, ex.failure(err)
		}
	}
}

// splice returns the body with local spliced in and the upstream's lag,
// or nil to send the original.
func (p *Proxy) splice(ctx context.Context, raw []byte, encoding string, q url.Values, munge munger, c Caller, local *LocalRecords) ([]byte, time.Duration) {
	plain, err := p.decode(raw, encoding)
	if err != nil {
		return nil, 0
	}
	body, err := decodeObject(plain)
	if err != nil {
		return nil, 0
	}
	v, done := p.newViewer(ctx, c, local)
	defer done()
	if !munge(v, body, q) {
		return nil, 0
	}
	out := p.encode(c.DID, body)
	if out == nil {
		return nil, 0
	}
	return out, local.lag(time.Now())
}

// recordsSince is LocalState.RecordsSince for what st says the upstream
// may lack, nil when there is nothing to splice or the lookup failed
// (logged).
func (p *Proxy) recordsSince(ctx context.Context, did syntax.DID, st staleness) *LocalRecords {
	local, err := p.cfg.Local.RecordsSince(ctx, did, st.since)
	if err == nil && local == nil && st.orSince != "" {
		local, err = p.cfg.Local.RecordsSince(ctx, did, st.orSince)
	}
	if err != nil {
		p.logger.Warn("read-after-write: local records lookup failed", "did", did, "error", err)
		return nil
	}
	if local != nil && st.postsOnly && local.ProfileChanged {
		posts := *local
		posts.ProfileChanged = false
		local = &posts
	}
	if local == nil || (len(local.Posts) == 0 && !local.ProfileChanged) {
		return nil
	}
	return local
}

// encode is body as JSON without HTML escaping, nil if it cannot be.
func (p *Proxy) encode(did syntax.DID, body map[string]any) []byte {
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		p.logger.Warn("read-after-write: encoding failed", "did", did, "error", err)
		return nil
	}
	return out.Bytes()
}

// decode undoes the content encoding the upstream chose among those
// acceptEncoding allowed, within MaxResponseBytes.
func (p *Proxy) decode(raw []byte, encoding string) ([]byte, error) {
	switch encoding {
	case "", "identity":
		return raw, nil
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, err
		}
		plain, err := io.ReadAll(io.LimitReader(zr, p.cfg.MaxResponseBytes+1))
		if err != nil {
			return nil, err
		}
		if int64(len(plain)) > p.cfg.MaxResponseBytes {
			return nil, errors.New("decoded response too large")
		}
		return plain, nil
	default:
		return nil, errors.New("unsupported content encoding")
	}
}

// decodeObject decodes a JSON object keeping numbers as they were written.
func decodeObject(raw []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("not a JSON object")
	}
	return m, nil
}

// lag is how long ago the oldest spliced record was written: how far the
// upstream is behind.
func (l *LocalRecords) lag(now time.Time) time.Duration {
	var oldest time.Time
	if l.ProfileChanged && l.Profile != nil {
		oldest = l.Profile.IndexedAt
	}
	for _, p := range l.Posts {
		if oldest.IsZero() || p.IndexedAt.Before(oldest) {
			oldest = p.IndexedAt
		}
	}
	if oldest.IsZero() || oldest.After(now) {
		return 0
	}
	return now.Sub(oldest)
}

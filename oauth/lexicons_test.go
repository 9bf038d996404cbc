package oauth_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// lexicons is a LexiconResolver over published documents, standing in for
// lexicon resolution (package lexresolve, tested against a DNS server and
// PDS of its own; the pds package's tests resolve through Bulwark
// itself). It counts resolutions, and can fail or hold them.
type lexicons struct {
	mu    sync.Mutex
	docs  map[syntax.NSID]json.RawMessage
	fail  map[syntax.NSID]error
	calls map[syntax.NSID]int
	// gate, when set, holds every resolution until it is closed; entered
	// receives the NSID of each held resolution.
	gate    chan struct{}
	entered chan syntax.NSID
}

var errUnpublished = errors.New("lexicon not published: no _lexicon TXT record at 192.0.2.7")

func newLexicons() *lexicons {
	return &lexicons{docs: map[syntax.NSID]json.RawMessage{}, fail: map[syntax.NSID]error{}, calls: map[syntax.NSID]int{}}
}

func (l *lexicons) ResolveLexicon(ctx context.Context, nsid syntax.NSID) (json.RawMessage, error) {
	l.mu.Lock()
	l.calls[nsid]++
	gate, entered := l.gate, l.entered
	l.mu.Unlock()
	if gate != nil {
		entered <- nsid
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.fail[nsid]; err != nil {
		return nil, err
	}
	doc, ok := l.docs[nsid]
	if !ok {
		return nil, errUnpublished
	}
	return doc, nil
}

func (l *lexicons) count(nsid string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[syntax.NSID(nsid)]
}

func (l *lexicons) setFail(nsid string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fail[syntax.NSID(nsid)] = err
}

// publish stores a permission set's lexicon document.
func (l *lexicons) publish(t *testing.T, nsid, title string, perms ...map[string]any) {
	l.publishRaw(t, nsid, map[string]any{
		"$type": "com.atproto.lexicon.schema", "lexicon": 1, "id": nsid,
		"defs": map[string]any{"main": map[string]any{
			"type": "permission-set", "title": title, "detail": "What " + title + " is for.", "permissions": perms,
		}},
	})
}

func (l *lexicons) publishRaw(t *testing.T, nsid string, doc any) {
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.docs[syntax.NSID(nsid)] = b
}

func repoPerm(action []string, collections ...string) map[string]any {
	p := map[string]any{"type": "permission", "resource": "repo", "collection": collections}
	if action != nil {
		p["action"] = action
	}
	return p
}

func rpcPerm(aud string, inherit bool, lxm ...string) map[string]any {
	p := map[string]any{"type": "permission", "resource": "rpc", "lxm": lxm}
	if aud != "" {
		p["aud"] = aud
	}
	if inherit {
		p["inheritAud"] = true
	}
	return p
}

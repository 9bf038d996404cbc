package oauth

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// docResolver serves lexicon documents from a function.
type docResolver func(nsid syntax.NSID) (json.RawMessage, error)

func (d docResolver) ResolveLexicon(_ context.Context, nsid syntax.NSID) (json.RawMessage, error) {
	return d(nsid)
}

func setDocument(t *testing.T, nsid string, perms ...any) json.RawMessage {
	b, err := json.Marshal(map[string]any{"lexicon": 1, "id": nsid, "defs": map[string]any{
		"main": map[string]any{"type": "permission-set", "title": "T", "permissions": perms}}})
	require.NoError(t, err)
	return b
}

// TestSetCacheBounded: however many distinct sets are named, published or
// not, the cache holds at most its entries within its bytes (smaller
// bounds here than the server's, the same code), and keeps working.
func TestSetCacheBounded(t *testing.T) {
	t.Parallel()
	// Sets near the largest document, with few long names (quick to
	// parse).
	seg := strings.Repeat("a", 63)
	var perms []any
	for i := range maxSetPermissions {
		var cols []string
		for j := range 4 {
			cols = append(cols, fmt.Sprintf("com.example.big.%s.%s.%s.n%02d%d", seg, seg, seg, i, j))
		}
		perms = append(perms, map[string]any{"type": "permission", "resource": "repo", "collection": cols})
	}
	big := setDocument(t, "com.example.big.authAll", perms...)
	small := setDocument(t, "com.example.big.authAll", perms[0])
	cfg := &Config{Now: time.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Lexicons: docResolver(func(nsid syntax.NSID) (json.RawMessage, error) {
			doc := small
			switch {
			case strings.HasSuffix(string(nsid), "0"):
				return nil, fmt.Errorf("not published")
			case strings.HasPrefix(string(nsid), "com.example.big.authBig"):
				doc = big
			}
			return []byte(strings.Replace(string(doc), "com.example.big.authAll", string(nsid), 1)), nil
		})}
	sc := newSetCache(cfg)
	sc.maxEntries, sc.maxBytes = 100, 1<<20
	// Many small sets and failures (the entry bound), then large sets
	// (the byte bound).
	names := make([]string, 0, 200)
	for i := range sc.maxEntries + 20 {
		names = append(names, fmt.Sprintf("com.example.big.auth%d", i))
	}
	for i := range 30 {
		names = append(names, fmt.Sprintf("com.example.big.authBig%d", i))
	}
	for i, name := range names {
		set, err := sc.get(context.Background(), syntax.NSID(name))
		if strings.HasSuffix(name, "0") {
			require.Error(t, err, name)
		} else {
			require.NoError(t, err, name)
			require.NotEmpty(t, set.expand(""))
		}
		entries, bytes := sc.stats()
		require.LessOrEqual(t, entries, sc.maxEntries, i)
		require.LessOrEqual(t, bytes, sc.maxBytes, i)
	}
	entries, bytes := sc.stats()
	require.Greater(t, entries, 5)
	require.Greater(t, bytes, sc.maxBytes/2)
}

func (sc *setCache) stats() (entries, bytes int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.items), sc.bytes
}

// TestParsePermissionSetNamespace: a set's permissions reach only its
// own group and below.
func TestParsePermissionSetNamespace(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"app.example.feed.post":         true,
		"app.example.feed.sub.thing":    true,
		"App.Example.Feed.post":         true,
		"app.example.actor.profile":     false,
		"app.example.feed":              false,
		"app.examplefeed.post":          false,
		"app.example.feedx.post":        false,
		"com.example.feed.post":         false,
		"app.example.feed.authOnlyPost": true,
	} {
		require.Equal(t, ok, inNamespace("app.example.feed.authOnlyPost", name), name)
	}
	require.True(t, inNamespace("app.example.authFull", "app.example.actor.profile"))
}

// TestShownText: a publisher's title cannot reorder or hide what the
// page says, nor run long.
func TestShownText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "Read only evil", shownText("Read only\u202e\u200b  evil\x00\n", 100))
	require.Equal(t, "abc…", shownText("abcdef", 3))
	require.Equal(t, "", shownText("\xff\xfe", 10))
}

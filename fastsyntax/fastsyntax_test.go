package fastsyntax

import (
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// The fast parsers must accept and refuse exactly what indigo's do.
func TestRecordKeyAgreesWithIndigo(t *testing.T) {
	keys := []string{"", ".", "..", "...", "a", "3jzfcijpj2z2a", "self", "a.b", "a:b", "a~b", "a_b", "a-b",
		"a/b", "a b", "a#b", "a@b", "é", "a\x00", "a%20", strings.Repeat("k", 512), strings.Repeat("k", 513),
		"literal:self", "..a", "a..", "\xff", "A-Z_0~9.:"}
	// Every single byte, alone and inside a key.
	for c := 0; c < 256; c++ {
		keys = append(keys, string([]byte{byte(c)}), "ab"+string([]byte{byte(c)})+"cd")
	}
	agree(t, syntax.ParseRecordKey, ParseRecordKey, keys)
}

// agree checks that fast gives indigo's answer, value and error, for every
// input.
func agree[T comparable](t *testing.T, indigo, fast func(string) (T, error), inputs []string) {
	t.Helper()
	for _, in := range inputs {
		want, wantErr := indigo(in)
		got, gotErr := fast(in)
		require.Equal(t, wantErr, gotErr, "%q", in)
		require.Equal(t, want, got, "%q", in)
	}
}

func TestNSIDAgreesWithIndigo(t *testing.T) {
	ids := []string{"app.bsky.feed.post", "com.example.fooBar", "com.atproto.repo.createRecord", "a.b.c",
		"", "app", "app.bsky", "app..bsky.post", "app.bsky.feed.post.", "1app.bsky.post", "app.bsky.feed.1post",
		"app.bsky.feed.po-st", "app.bsky.feed.post#main", "com.example.-bad.thing", strings.Repeat("a", 63) + ".b.c",
		strings.Repeat("a", 64) + ".b.c"}
	for range 2 { // the second pass answers from memory
		agree(t, syntax.ParseNSID, ParseNSID, ids)
	}
}

func BenchmarkParse(b *testing.B) {
	b.Run("indigo", func(b *testing.B) {
		for range b.N {
			_, _ = syntax.ParseNSID("app.bsky.feed.post")
			_, _ = syntax.ParseRecordKey("3jzfcijpj2z2a")
		}
	})
	b.Run("fast", func(b *testing.B) {
		for range b.N {
			_, _ = ParseNSID("app.bsky.feed.post")
			_, _ = ParseRecordKey("3jzfcijpj2z2a")
		}
	})
}

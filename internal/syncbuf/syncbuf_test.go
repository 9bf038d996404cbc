package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWriteAndRead: writers and a reader at once (run with
// -race); every write is kept whole.
func TestConcurrentWriteAndRead(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("line\n"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "line\n"); got != 400 {
		t.Fatalf("got %d lines, want 400", got)
	}
}

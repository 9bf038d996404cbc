package pds

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkSubscribeRefused measures refused subscribeRepos upgrades from
// one client over keep-alive connections (the client and the server share
// this process's CPUs, so the figures are a floor). It fails if a refusal
// touches the database.
//
//	go test ./pds -run '^$' -bench SubscribeRefused -benchtime 200000x
func BenchmarkSubscribeRefused(b *testing.B) {
	fb := setupFirehose(b, nil, nil)
	// Spend the burst on requests that are not upgrades (they are admitted,
	// then refused as bad requests, before any database work).
	for range 10 {
		resp, err := http.Get(fb.url + "/xrpc/com.atproto.sync.subscribeRepos")
		require.NoError(b, err)
		resp.Body.Close()
	}
	// Only requests are counted: the hub's own reads are not theirs.
	before := fb.queries.n.Load()
	addr := strings.TrimPrefix(fb.url, "http://")
	raw := []byte("GET /xrpc/com.atproto.sync.subscribeRepos?cursor=0 HTTP/1.1\r\nHost: " + addr +
		"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	b.ResetTimer()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		// A bare HTTP/1.1 client on one keep-alive connection: net/http's
		// client costs more CPU than the server it measures.
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		for pb.Next() {
			if _, err := conn.Write(raw); err != nil {
				b.Error(err)
				return
			}
			status, err := readResponse(br)
			if err != nil {
				b.Error(err)
				return
			}
			if status != http.StatusTooManyRequests {
				b.Errorf("status %d", status)
				return
			}
		}
	})
	b.StopTimer()
	elapsed := time.Since(start)
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "refusals/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/refusal(client+server)")
	require.Equal(b, before, fb.queries.n.Load(), "refusals must not touch the database")
}

// readResponse reads one HTTP/1.1 response with a Content-Length body and
// returns its status.
func readResponse(br *bufio.Reader) (int, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return 0, err
	}
	var status int
	if _, err := fmt.Sscanf(line, "HTTP/1.1 %d", &status); err != nil {
		return 0, fmt.Errorf("status line %q: %w", line, err)
	}
	n := 0
	for {
		h, err := br.ReadString('\n')
		if err != nil {
			return 0, err
		}
		if h == "\r\n" {
			break
		}
		if k, v, ok := strings.Cut(h, ":"); ok && strings.EqualFold(k, "Content-Length") {
			n, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	_, err = br.Discard(n)
	return status, err
}

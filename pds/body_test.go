package pds

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// trickler is a POST whose body is sent slowly.
type trickler struct {
	conn     net.Conn
	answered chan *http.Response
	sent     int
	length   int
}

// startTrickle opens a connection to hostport and sends a POST to path
// whose body is declared as length bytes, with head of it at once.
func startTrickle(t *testing.T, hostport, path string, length int, head string) *trickler {
	t.Helper()
	conn, err := net.Dial("tcp", hostport)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, hostport, length, head)
	require.NoError(t, err)
	tr := &trickler{conn: conn, answered: make(chan *http.Response, 1), sent: len(head), length: length}
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			close(tr.answered)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		tr.answered <- resp
	}()
	return tr
}

// run sends the rest of the body a byte every interval until the server
// answers or stop is closed. It returns the server's answer, or nil when
// stop came first.
func (tr *trickler) run(interval time.Duration, stop <-chan struct{}) *http.Response {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ; tr.sent < tr.length; tr.sent++ {
		select {
		case resp := <-tr.answered:
			return resp
		case <-stop:
			return nil
		case <-tick.C:
			if _, err := tr.conn.Write([]byte(" ")); err != nil {
				return <-tr.answered
			}
		}
	}
	return <-tr.answered
}

// TestDownloadNotHeldByTrickledWrite: a createRecord whose body trickles
// in (here it never completes) is not foreground work until its commit:
// while it is being read, nothing is in flight in the priority gate, and
// an 8 MB getBlob meanwhile (256 chunks, each of which would pause for a
// write in flight) is never paused.
func TestDownloadNotHeldByTrickledWrite(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "trickle", "active")
	data := pngData(t, 8<<20)
	ref := b.uploadOK(t, did, data, "")
	require.NoError(t, b.postBlobs(t, did, "3kblob", ref))

	// A second listener on the same server, which says when the
	// createRecord handler first reads its body.
	reading := make(chan struct{})
	var once sync.Once
	h := b.server.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "createRecord") {
			r.Body = readCloser{&firstRead{r: r.Body, first: func() { once.Do(func() { close(reading) }) }}, r.Body}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	stop := make(chan struct{})
	trickled := make(chan *http.Response, 1)
	tr := startTrickle(t, ts.Listener.Addr().String(), "/xrpc/com.atproto.repo.createRecord", 4096, `{"repo":`)
	go func() { trickled <- tr.run(50*time.Millisecond, stop) }()
	select {
	case <-reading:
	case <-time.After(10 * time.Second):
		t.Fatal("the trickled createRecord never reached its handler")
	}

	gate := b.server.Priority()
	before := gate.Stats()
	require.Zero(t, before.InFlight, "a write whose body is still arriving is foreground work")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/xrpc/com.atproto.sync.getBlob?"+url.Values{"did": {did.String()}, "cid": {ref.Ref.String()}}.Encode(), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, bytes.Equal(data, got))
	after := gate.Stats()
	close(stop)
	require.Nil(t, <-trickled, "the trickled write was still being read")

	require.Equal(t, before.Entered, after.Entered, "the trickled write entered the gate")
	require.Equal(t, before.Waits, after.Waits, "the download paused for a write that was only being received")
	require.Zero(t, after.Paused-before.Paused)
}

// firstRead calls first before its first Read.
type firstRead struct {
	r     io.Reader
	first func()
}

func (f *firstRead) Read(p []byte) (int, error) {
	f.first()
	return f.r.Read(p)
}

// TestTrickledUploadCutOff: an upload body that arrives slower than the
// minimum rate is cut off once the grace period is over, answered with
// an error saying so, and nothing is kept; an upload arriving slowly but
// above the rate, for longer than the grace period, is stored.
func TestTrickledUploadCutOff(t *testing.T) {
	t.Parallel()
	// The grace period is long enough that a loaded machine's scheduling
	// pauses between the paced writes below do not count as idling.
	b := syncSetup(t, syncOptions{bodyRate: &bodyRate{grace: time.Second, rate: 16 << 10}})
	did := b.newAccount(t, "slowpoke", "active")
	b.as(did)
	host := strings.TrimPrefix(b.url, "http://")

	// A byte every 20 ms is 50 bytes a second: cut off after the grace
	// period. The deadline only bounds a failing test: the old per-read
	// idle timeout (30 s) would let this trickle on for good.
	stop := make(chan struct{})
	timer := time.AfterFunc(20*time.Second, func() { close(stop) })
	defer timer.Stop()
	resp := startTrickle(t, host, "/xrpc/com.atproto.repo.uploadBlob", 1<<20, "\x89PNG").run(20*time.Millisecond, stop)
	require.NotNil(t, resp, "the trickled upload was not cut off")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM blobs").Scan(&n))
	require.Zero(t, n)

	// 256 KiB at about 128 KiB a second (eight times the rate), two
	// seconds in all: twice the grace period, and stored whole.
	data := pngData(t, 256<<10)
	pr, pw := io.Pipe()
	go func() {
		pace := time.NewTicker(60 * time.Millisecond)
		defer pace.Stop()
		for chunk := range slices.Chunk(data, 8<<10) {
			<-pace.C
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
		pw.Close()
	}()
	req, err := http.NewRequest(http.MethodPost, b.url+"/xrpc/com.atproto.repo.uploadBlob", pr)
	require.NoError(t, err)
	req.ContentLength = int64(len(data))
	up, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(up.Body)
	up.Body.Close()
	require.Equal(t, http.StatusOK, up.StatusCode, "body: %s", body)
}

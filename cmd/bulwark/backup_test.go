package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/events"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/backup"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// managedDataDir is a data dir for a managed cluster. Under root Postgres
// runs as another user, which must be able to traverse every directory
// above it; MkdirTemp makes 0700 ones.
func managedDataDir(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "bulwark-backup-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(root, 0o711))
	dataDir := filepath.Join(root, "data")
	t.Cleanup(func() {
		stopOrphanedPostgres(t, dataDir)
		_ = os.RemoveAll(root)
	})
	return dataDir
}

// content is what a server serves, to compare before a backup and after
// its restore.
type content struct {
	repos     map[string][]byte // getRepo CAR by DID
	blobs     map[string][]byte // getBlob bytes by DID/CID
	listRepos []byte
	frames    [][]byte // subscribeRepos from cursor 0, up to the last event
}

// testUser is an account populate made.
type testUser struct {
	did, handle, password string
	blobs                 []string
}

// populate makes two accounts with records, blobs referenced by records,
// and a deleted record, so the firehose holds every kind of event.
func populate(t *testing.T, s *liveServer) []testUser {
	t.Helper()
	var users []testUser
	for _, name := range []string{"alice", "bob"} {
		var acct createdAccount
		s.adminJSON(t, &acct, "account", "create", "--handle", name, "--email", name+"@example.com")
		u := testUser{did: acct.DID, handle: acct.Handle, password: acct.Password}
		token, status := s.login(t, u.handle, u.password)
		require.Equal(t, http.StatusOK, status)
		for i, size := range []int{3 << 10, 70 << 10} {
			data := make([]byte, size)
			_, _ = rand.Read(data)
			var up struct {
				Blob map[string]any `json:"blob"`
			}
			status, body := s.xrpc(t, http.MethodPost, "com.atproto.repo.uploadBlob", token, nil, data, &up)
			require.Equal(t, http.StatusOK, status, "%s", body)
			u.blobs = append(u.blobs, up.Blob["ref"].(map[string]any)["$link"].(string))
			s.createRecord(t, token, u.did, "com.example.photo", map[string]any{"$type": "com.example.photo", "image": up.Blob, "n": i})
		}
		for i := range 3 {
			s.createRecord(t, token, u.did, "com.example.note", map[string]any{"$type": "com.example.note", "text": fmt.Sprint("note ", i)})
		}
		status, body := s.xrpc(t, http.MethodPost, "com.atproto.repo.deleteRecord", token, nil,
			map[string]string{"repo": u.did, "collection": "com.example.note", "rkey": s.lastRKey}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
		users = append(users, u)
	}
	return users
}

func (s *liveServer) createRecord(t *testing.T, token, did, collection string, record any) {
	t.Helper()
	var out struct {
		URI string `json:"uri"`
	}
	status, body := s.xrpc(t, http.MethodPost, "com.atproto.repo.createRecord", token, nil,
		map[string]any{"repo": did, "collection": collection, "record": record}, &out)
	require.Equal(t, http.StatusOK, status, "%s", body)
	s.lastRKey = out.URI[strings.LastIndex(out.URI, "/")+1:]
}

// read captures what s serves for users.
func (s *liveServer) read(t *testing.T, users []testUser) content {
	t.Helper()
	c := content{repos: map[string][]byte{}, blobs: map[string][]byte{}}
	for _, u := range users {
		status, car := s.xrpc(t, http.MethodGet, "com.atproto.sync.getRepo", "", url.Values{"did": {u.did}}, nil, nil)
		require.Equal(t, http.StatusOK, status)
		c.repos[u.did] = car
		for _, b := range u.blobs {
			status, data := s.xrpc(t, http.MethodGet, "com.atproto.sync.getBlob", "", url.Values{"did": {u.did}, "cid": {b}}, nil, nil)
			require.Equal(t, http.StatusOK, status, "%s", data)
			c.blobs[u.did+"/"+b] = data
		}
	}
	status, list := s.xrpc(t, http.MethodGet, "com.atproto.sync.listRepos", "", nil, nil, nil)
	require.Equal(t, http.StatusOK, status)
	c.listRepos = list
	c.frames = s.replay(t, users)
	return c
}

// sequenced waits until every user's latest commit has its firehose seq
// (the sequencer numbers events after they commit) and returns the highest.
func (s *liveServer) sequenced(t *testing.T, users []testUser) int64 {
	t.Helper()
	var last int64
	for _, u := range users {
		var head struct {
			Rev string `json:"rev"`
		}
		status, body := s.xrpc(t, http.MethodGet, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {u.did}}, nil, &head)
		require.Equal(t, http.StatusOK, status, "%s", body)
		ev := s.waitEvent(t, func(e firehoseEvent) bool {
			return e.DID == u.did && e.Rev == head.Rev && (e.Kind == "commit" || e.Kind == "sync")
		})
		last = max(last, ev.Seq)
	}
	return last
}

// waitEvent polls the admin event listing until an event matches, and
// returns it. Polled on the test's goroutine, so that require may stop it.
func (s *liveServer) waitEvent(t *testing.T, match func(firehoseEvent) bool) firehoseEvent {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(waitLimit)
	for {
		var evs struct {
			Events []firehoseEvent `json:"events"`
		}
		s.adminJSON(t, &evs, "firehose", "events", "--limit", "1000")
		for _, e := range evs.Events {
			if match(e) {
				return e
			}
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("no such firehose event after %v", waitLimit)
		}
	}
}

// replay reads subscribeRepos from cursor 0 up to the users' last commit,
// and returns the frames as sent.
func (s *liveServer) replay(t *testing.T, users []testUser) [][]byte {
	t.Helper()
	last := s.sequenced(t, users)
	ws := "ws" + strings.TrimPrefix(s.url, "http") + "/xrpc/com.atproto.sync.subscribeRepos?cursor=0"
	conn, resp, err := websocket.DefaultDialer.Dial(ws, nil)
	require.NoError(t, err)
	resp.Body.Close()
	defer conn.Close()
	var frames [][]byte
	for {
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitLimit)))
		_, raw, err := conn.ReadMessage()
		require.NoError(t, err)
		seq, ok := frameSeq(t, raw)
		if !ok {
			continue // #info
		}
		frames = append(frames, raw)
		if seq >= last {
			return frames
		}
	}
}

// frameSeq decodes a frame's seq; ok is false for frames without one.
func frameSeq(t *testing.T, raw []byte) (int64, bool) {
	t.Helper()
	r := bytes.NewReader(raw)
	var hdr events.EventHeader
	require.NoError(t, hdr.UnmarshalCBOR(r))
	require.NotEqual(t, events.EvtKindErrorFrame, hdr.Op, "error frame")
	switch hdr.MsgType {
	case "#commit":
		var ev comatproto.SyncSubscribeRepos_Commit
		require.NoError(t, ev.UnmarshalCBOR(r))
		return ev.Seq, true
	case "#sync":
		var ev comatproto.SyncSubscribeRepos_Sync
		require.NoError(t, ev.UnmarshalCBOR(r))
		return ev.Seq, true
	case "#identity":
		var ev comatproto.SyncSubscribeRepos_Identity
		require.NoError(t, ev.UnmarshalCBOR(r))
		return ev.Seq, true
	case "#account":
		var ev comatproto.SyncSubscribeRepos_Account
		require.NoError(t, ev.UnmarshalCBOR(r))
		return ev.Seq, true
	}
	return 0, false
}

func requireSameContent(t *testing.T, want, got content) {
	t.Helper()
	require.Equal(t, len(want.repos), len(got.repos))
	for did, car := range want.repos {
		require.True(t, bytes.Equal(car, got.repos[did]), "getRepo of %s differs after the restore", did)
	}
	require.Equal(t, want.blobs, got.blobs)
	require.JSONEq(t, string(want.listRepos), string(got.listRepos))
	require.Equal(t, len(want.frames), len(got.frames), "firehose replay length")
	for i := range want.frames {
		require.True(t, bytes.Equal(want.frames[i], got.frames[i]), "firehose frame %d differs", i)
	}
}

// writesAfterRestore: a restored account logs in with its old password and
// commits, which needs the restored secrets (the rotation key unseals its
// signing key).
func writesAfterRestore(t *testing.T, s *liveServer, u testUser) {
	t.Helper()
	token, status := s.login(t, u.handle, u.password)
	require.Equal(t, http.StatusOK, status)
	s.createRecord(t, token, u.did, "com.example.note", map[string]any{"$type": "com.example.note", "text": "after the restore"})
}

// requireRaiseSeqAdvice: restore's last lines say where the restored
// firehose ends and how to let consumers that read past it back in.
func requireRaiseSeqAdvice(t *testing.T, stdout string, before content) {
	t.Helper()
	last, ok := frameSeq(t, before.frames[len(before.frames)-1])
	require.True(t, ok)
	require.Contains(t, stdout, fmt.Sprintf("Next: the restored firehose ends at seq %d.", last))
	require.Contains(t, stdout, "(FutureCursor)")
	require.Contains(t, stdout, "bulwark admin firehose raise-seq --floor CURSOR")
}

// TestBackupRestoreManaged backs up a running server on the managed
// Postgres into a directory, restores it into a fresh data dir, and serves
// the same repositories, blobs, listing and firehose from it.
func TestBackupRestoreManaged(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the managed backup test (initialises two Postgres clusters) in -short mode")
	}
	t.Parallel()
	_, plc := plctest.NewServer(t)
	src := startLiveServer(t, serverOptions{managed: true, dataDir: managedDataDir(t), plcURL: plc.URL,
		extra: []string{"--postgres-settings", "work_mem=7MB, log_temp_files=12345"}})
	// The operator's settings reach the managed cluster, over Bulwark's own.
	pgURL, ok := runningClusterURL(context.Background(), filepath.Join(src.dataDir, ManagedPostgresDir))
	require.True(t, ok)
	conn, err := pgx.Connect(context.Background(), pgURL)
	require.NoError(t, err)
	var workMem, tempFiles string
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT current_setting('work_mem'), current_setting('log_temp_files')").Scan(&workMem, &tempFiles))
	conn.Close(context.Background())
	require.Equal(t, "7MB", workMem)
	require.Equal(t, "12345kB", tempFiles)
	users := populate(t, src)
	before := src.read(t, users)

	out := filepath.Join(t.TempDir(), "backup")
	code, stdout, errOut := cli("backup", "--data-dir", src.dataDir, "--hostname", src.hostname, "--out", out)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, stdout, "backed up to "+out)
	m, err := backup.ReadManifest(out)
	require.NoError(t, err)
	require.Equal(t, int64(4), m.Blobs.Count)
	require.Len(t, m.Secrets.Files, 3)
	require.Equal(t, src.hostname, m.Hostname)
	src.stop(t)

	code, _, errOut = cli("restore", "--from", out, "--data-dir", src.dataDir)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not empty")

	dst := managedDataDir(t)
	code, stdout, errOut = cli("restore", "--from", out, "--data-dir", dst, "--hostname", src.hostname)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, stdout, "restored into "+dst)
	requireRaiseSeqAdvice(t, stdout, before)
	restored := startLiveServer(t, serverOptions{managed: true, dataDir: dst, hostname: src.hostname, plcURL: plc.URL})
	requireSameContent(t, before, restored.read(t, users))
	writesAfterRestore(t, restored, users[0])

	// A corrupt blob is found before anything is written.
	blob := users[1].blobs[1]
	p := filepath.Join(out, backup.BlobsDir, blob[len(blob)-2:], blob)
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	data[len(data)/2] ^= 1
	require.NoError(t, os.WriteFile(p, data, 0o600))
	empty := managedDataDir(t)
	code, _, errOut = cli("restore", "--from", out, "--data-dir", empty)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "does not match its CID")
	entries, _ := os.ReadDir(empty)
	require.Empty(t, entries, "nothing written for a corrupt backup")
}

// TestBackupRestoreExternal does the same on an external Postgres, through
// a tar stream, into a database that needs --force.
func TestBackupRestoreExternal(t *testing.T) {
	t.Parallel()
	_, plc := plctest.NewServer(t)
	src := startLiveServer(t, serverOptions{plcURL: plc.URL, databaseURL: dbtest.NewURL(t)})
	users := populate(t, src)
	before := src.read(t, users)

	var stream, errOut bytes.Buffer
	code := run(context.Background(), []string{"backup", "--data-dir", src.dataDir, "--database-url", src.databaseURL,
		"--hostname", src.hostname, "--out", "-"}, &stream, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Contains(t, errOut.String(), "backed up to stdout (tar)")
	src.stop(t)

	target := dbtest.NewURL(t) // migrated, so not empty
	dst := t.TempDir()
	args := []string{"--from", "-", "--data-dir", dst, "--database-url", target, "--hostname", src.hostname}
	var out bytes.Buffer
	errOut.Reset()
	code = runRestore(context.Background(), args, bytes.NewReader(stream.Bytes()), &out, &errOut)
	require.Equal(t, 1, code)
	require.Contains(t, errOut.String(), "not empty")

	errOut.Reset()
	code = runRestore(context.Background(), append(args, "--force"), bytes.NewReader(stream.Bytes()), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.NoDirExists(t, filepath.Join(dst, restoreStagingDir))
	requireRaiseSeqAdvice(t, out.String(), before)
	restored := startLiveServer(t, serverOptions{dataDir: dst, databaseURL: target, hostname: src.hostname, plcURL: plc.URL})
	requireSameContent(t, before, restored.read(t, users))
	writesAfterRestore(t, restored, users[1])
}

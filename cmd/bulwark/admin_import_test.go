package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// cliServer is a whole server as serve builds it (newServer), on a test
// database and a local PLC directory.
type cliServer struct {
	url      string
	password string
}

// plcTestConfig is a configuration, not yet finalized, for a server on a
// test PLC directory of its own, with the admin password given and handles
// under .test.
func plcTestConfig(t *testing.T, adminPassword string) *config.Config {
	t.Helper()
	plcSrv := httptest.NewServer(plctest.New())
	t.Cleanup(plcSrv.Close)
	rotation, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.AdminPassword = adminPassword
	cfg.JWTSecret = strings.Repeat("j", 40)
	cfg.PLCURL = plcSrv.URL
	cfg.PLCRotationKey = rotation.Multibase()
	cfg.HandleDomains = []string{".test"}
	return cfg
}

func newCLIServer(t *testing.T) *cliServer {
	t.Helper()
	cfg := plcTestConfig(t, "cli-import-password")
	cfg.RateLimits = "off"
	require.NoError(t, cfg.Finalize())
	srv, _, err := newServer(context.Background(), cfg, dbtest.New(t), nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &cliServer{url: ts.URL, password: cfg.AdminPassword}
}

// call makes one XRPC request and decodes the JSON answer, requiring 200.
func (s *cliServer) call(t *testing.T, method, nsid, token, contentType string, body []byte) map[string]any {
	t.Helper()
	req, err := http.NewRequest(method, s.url+"/xrpc/"+nsid, bytes.NewReader(body))
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", nsid, data)
	out := map[string]any{}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(data, &out))
	} else {
		out["bytes"] = data
	}
	return out
}

func (s *cliServer) admin(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	all := append([]string{"admin", "--url", s.url, "--admin-password", s.password}, args...)
	code := run(context.Background(), all, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestAdminAccountExportImport exports an account with `bulwark admin
// account export` (repository, blobs, manifest), changes the account, and
// restores the export with `bulwark admin account import`.
func TestAdminAccountExportImport(t *testing.T) {
	t.Parallel()
	s := newCLIServer(t)
	acct := s.call(t, http.MethodPost, "com.atproto.server.createAccount", "", "application/json",
		[]byte(`{"handle":"carol.test","email":"carol@example.com","password":"correct horse battery"}`))
	did, token := acct["did"].(string), acct["accessJwt"].(string)
	picture := append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte("c"), 4000)...)
	up := s.call(t, http.MethodPost, "com.atproto.repo.uploadBlob", token, "image/png", picture)
	blobRef, err := json.Marshal(up["blob"])
	require.NoError(t, err)
	post := func(rkey string) {
		s.call(t, http.MethodPost, "com.atproto.repo.createRecord", token, "application/json", []byte(`{"repo":"`+did+`","collection":"app.bsky.feed.post","rkey":"`+rkey+`","record":{"$type":"app.bsky.feed.post","text":"hi","createdAt":"2026-11-29T00:00:00Z","embed":{"$type":"app.bsky.embed.images","images":[{"alt":"","image":`+string(blobRef)+`}]}}}`))
	}
	post("3lb2aaaaaaaa1")
	post("3lb2aaaaaaaa2")
	s.call(t, http.MethodPost, "app.bsky.actor.putPreferences", token, "application/json",
		[]byte(`{"preferences":[{"$type":"app.bsky.actor.defs#adultContentPref","enabled":true}]}`))

	dir := filepath.Join(t.TempDir(), "carol")
	code, out, errOut := s.admin("account", "export", "carol.test", dir)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, ", 1 blobs and 1 preferences")
	var m exportManifest
	raw, err := os.ReadFile(filepath.Join(dir, exportManifestFile))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &m))
	require.Equal(t, did, m.DID)
	require.Equal(t, 1, m.Blobs)
	require.Equal(t, 1, m.Preferences)
	prefs, err := os.ReadFile(filepath.Join(dir, exportPrefsFile))
	require.NoError(t, err)
	require.Contains(t, string(prefs), "adultContentPref")
	carFile, err := os.ReadFile(filepath.Join(dir, exportCARFile))
	require.NoError(t, err)
	commit, _, err := atrepo.LoadRepoFromCAR(context.Background(), bytes.NewReader(carFile))
	require.NoError(t, err)
	require.Equal(t, m.Rev, commit.Rev)
	cidStr := up["blob"].(map[string]any)["ref"].(map[string]any)["$link"].(string)
	got, err := os.ReadFile(filepath.Join(dir, exportBlobsDir, cidStr))
	require.NoError(t, err)
	require.Equal(t, picture, got)

	// The account loses a post; the export brings it back.
	s.call(t, http.MethodPost, "com.atproto.repo.deleteRecord", token, "application/json",
		[]byte(`{"repo":"`+did+`","collection":"app.bsky.feed.post","rkey":"3lb2aaaaaaaa1"}`))
	code, out, errOut = s.admin("account", "import", "--reason", "restore from backup", did, filepath.Join(dir, exportCARFile))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"records": 2`)
	s.call(t, http.MethodGet, "com.atproto.repo.getRecord?repo="+did+"&collection=app.bsky.feed.post&rkey=3lb2aaaaaaaa1", "", "", nil)
	served := s.call(t, http.MethodGet, "com.atproto.sync.getBlob?did="+did+"&cid="+cidStr, "", "", nil)
	require.Equal(t, picture, served["bytes"])
	code, out, _ = s.admin("audit", "--subject", did)
	require.Equal(t, 0, code)
	require.Contains(t, out, "restore from backup")

	// An administrator exports a deactivated account too.
	s.call(t, http.MethodPost, "com.atproto.server.deactivateAccount", token, "application/json", []byte(`{}`))
	code, _, errOut = s.admin("account", "export", did, filepath.Join(t.TempDir(), "again"))
	require.Equal(t, 0, code, errOut)

	code, _, errOut = s.admin("account", "import", did)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "account import [--reason TEXT] ACCOUNT CAR")
	code, _, errOut = s.admin("account", "import", "nobody.test", filepath.Join(dir, exportCARFile))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "HandleNotFound")
}

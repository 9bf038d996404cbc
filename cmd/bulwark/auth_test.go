package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServeServiceAuthUploadAndLoginBurst runs serve with its default
// limits: a service-auth token from getServiceAuth for this server and
// uploadBlob (the video service's way in) uploads once and is refused the
// second time; eight people signing in to one account at the same moment
// all get a session.
func TestServeServiceAuthUploadAndLoginBurst(t *testing.T) {
	t.Parallel()
	// The wait for a hash slot is raised from its default (5 s) to its most (30 s) so that a
	// loaded test machine, where one hash takes seconds, still measures
	// the queue rather than the machine: what is asserted is that the
	// eight queue instead of being refused at once.
	s := startLiveServer(t, serverOptions{extra: []string{"--ratelimits", "", "--password-wait", "30s"}})
	var acct struct {
		AccessJwt string `json:"accessJwt"`
		DID       string `json:"did"`
	}
	status, body := s.xrpc(t, http.MethodPost, "com.atproto.server.createAccount", "", nil,
		map[string]string{"handle": "video.test", "email": "video@example.com", "password": "correct horse battery"}, &acct)
	require.Equal(t, http.StatusOK, status, "%s", body)

	// The server's DID, as describeServer gives it: the token's audience.
	var desc struct {
		DID string `json:"did"`
	}
	status, body = s.xrpc(t, http.MethodGet, "com.atproto.server.describeServer", "", nil, nil, &desc)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var tok struct {
		Token string `json:"token"`
	}
	status, body = s.xrpc(t, http.MethodGet, "com.atproto.server.getServiceAuth", acct.AccessJwt,
		url.Values{"aud": {desc.DID}, "lxm": {"com.atproto.repo.uploadBlob"}}, nil, &tok)
	require.Equal(t, http.StatusOK, status, "%s", body)
	video := append([]byte("\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00isommp42"), bytes.Repeat([]byte{7}, 4096)...)
	upload := func() (int, []byte) {
		req, err := http.NewRequest(http.MethodPost, s.url+"/xrpc/com.atproto.repo.uploadBlob", bytes.NewReader(video))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "video/mp4")
		req.Header.Set("Authorization", "Bearer "+tok.Token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, b
	}
	status, body = upload()
	require.Equal(t, http.StatusOK, status, "%s", body)
	var out struct {
		Blob struct {
			MimeType string `json:"mimeType"`
			Size     int    `json:"size"`
		} `json:"blob"`
	}
	require.NoError(t, json.Unmarshal(body, &out))
	require.Equal(t, "video/mp4", out.Blob.MimeType)
	require.Equal(t, len(video), out.Blob.Size)
	status, body = upload()
	require.Equal(t, http.StatusUnauthorized, status, "%s", body)
	require.Contains(t, string(body), "JwtReplayed")

	const people = 8
	results := make(chan int, people)
	for range people {
		go func() {
			b, _ := json.Marshal(map[string]string{"identifier": "video.test", "password": "correct horse battery"})
			resp, err := http.Post(s.url+"/xrpc/com.atproto.server.createSession", "application/json", bytes.NewReader(b))
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	for range people {
		require.Equal(t, http.StatusOK, <-results)
	}
}

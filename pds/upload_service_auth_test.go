package pds

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/blob"
)

// serviceToken asks getServiceAuth, as u, for a token for aud and lxm.
func (e *accountEnv) serviceToken(t *testing.T, u *user, aud, lxm string) string {
	t.Helper()
	q := url.Values{"aud": {aud}}
	if lxm != "" {
		q.Set("lxm", lxm)
	}
	tok := e.get(t, "com.atproto.server.getServiceAuth", u.access, q).ok(t).str(t, "token")
	require.NotEmpty(t, tok)
	return tok
}

// uploadWith sends uploadBlob with token as the Bearer credential.
func (e *accountEnv) uploadWith(t *testing.T, token, contentType string, data []byte) xrpcResult {
	t.Helper()
	h := http.Header{"Content-Type": {contentType}}
	return e.do(t, http.MethodPost, uploadBlobNSID, token, bytes.NewReader(data), nil, h)
}

// signJWT signs arbitrary header and claims with key, for tokens
// getServiceAuth would never issue.
func signJWT(t *testing.T, key atcrypto.PrivateKey, header, claims map[string]any) string {
	t.Helper()
	b64 := base64.RawURLEncoding
	hb, err := json.Marshal(header)
	require.NoError(t, err)
	cb, err := json.Marshal(claims)
	require.NoError(t, err)
	input := b64.EncodeToString(hb) + "." + b64.EncodeToString(cb)
	sig, err := key.HashAndSign([]byte(input))
	require.NoError(t, err)
	return input + "." + b64.EncodeToString(sig)
}

// mp4Data is an MP4 file's first box (ftyp, brand mp42) and n random
// bytes: what http.DetectContentType calls video/mp4.
func mp4Data(t testing.TB, n int) []byte {
	head := []byte("\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00isommp42")
	return append(head, randomBytes(t, n)...)
}

func (e *accountEnv) blobRows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM blobs").Scan(&n))
	return n
}

// TestUploadBlobWithServiceAuth: uploadBlob takes a service-auth token
// the account got from getServiceAuth for this server and this method, as
// the Bluesky app's video service sends it, once.
func TestUploadBlobWithServiceAuth(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{blobs: true})
	u := e.createUser(t)
	tok := e.serviceToken(t, u, e.cfg.ServiceDID(), uploadBlobNSID)
	video := mp4Data(t, 4096)
	res := e.uploadWith(t, tok, "video/mp4", video).ok(t)
	var out uploadBlobOutput
	require.NoError(t, json.Unmarshal(res.body, &out))
	require.Equal(t, blob.ComputeCID(video).String(), out.Blob.Ref.String())
	require.Equal(t, "video/mp4", out.Blob.MimeType)
	var owner string
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT did FROM blobs WHERE cid = $1", out.Blob.Ref.String()).Scan(&owner))
	require.Equal(t, u.did.String(), owner)

	// Once only.
	e.uploadWith(t, tok, "video/mp4", video).fails(t, http.StatusUnauthorized, "JwtReplayed")

	// A token whose upload broke off may be used again.
	tok = e.serviceToken(t, u, e.cfg.ServiceDID(), uploadBlobNSID)
	e.uploadWith(t, tok, "video/mp4", make([]byte, e.cfg.BlobMaxBytes+1)).fails(t, http.StatusRequestEntityTooLarge, "PayloadTooLarge")
	e.uploadWith(t, tok, "video/mp4", video).ok(t)
}

// TestUploadBlobServiceAuthRefusals: every way a service-auth token can be
// wrong is refused with a named 401, and stores nothing.
func TestUploadBlobServiceAuthRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newAccountEnv(t, envOptions{blobs: true})
	u, other := e.createUser(t), e.createUser(t)
	us := e.cfg.ServiceDID()
	key, err := e.keys.SigningKey(ctx, u.did)
	require.NoError(t, err)
	otherKey, err := e.keys.SigningKey(ctx, other.did)
	require.NoError(t, err)
	stranger, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	p256, err := atcrypto.GeneratePrivateKeyP256()
	require.NoError(t, err)
	now := time.Now().Unix()
	claims := func(change map[string]any) map[string]any {
		c := map[string]any{"iss": u.did.String(), "aud": us, "lxm": uploadBlobNSID, "iat": now, "exp": now + 60, "jti": "j" + itoa(int(userSeq.Add(1)))}
		for k, v := range change {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		return c
	}
	es256k := map[string]any{"typ": "JWT", "alg": "ES256K"}
	ttlToken := func(ttl time.Duration) string {
		tok, err := e.accounts.ServiceAuthToken(ctx, u.did, us, uploadBlobNSID, ttl)
		require.NoError(t, err)
		return tok
	}
	cases := []struct {
		name, token, want string
	}{
		{"another method", e.serviceToken(t, u, us, "com.atproto.repo.createRecord"), "BadJwtLexiconMethod"},
		{"no method", signJWT(t, key, es256k, claims(map[string]any{"lxm": nil})), "BadJwtLexiconMethod"},
		{"another service", e.serviceToken(t, u, "did:web:video.bsky.app", uploadBlobNSID), "BadJwtAudience"},
		{"this server's #atproto_pds", e.serviceToken(t, u, us+"#atproto_pds", uploadBlobNSID), "BadJwtAudience"},
		{"expired", ttlToken(-time.Minute), "JwtExpired"},
		{"expires too far ahead", ttlToken(2 * time.Hour), "BadJwt"},
		{"issued in the future", signJWT(t, key, es256k, claims(map[string]any{"iat": now + 600})), "BadJwt"},
		{"no exp", signJWT(t, key, es256k, claims(map[string]any{"exp": nil})), "BadJwt"},
		{"no jti", signJWT(t, key, es256k, claims(map[string]any{"jti": nil})), "BadJwt"},
		{"jti too long", signJWT(t, key, es256k, claims(map[string]any{"jti": strings.Repeat("j", 200)})), "BadJwt"},
		{"another account's key", signJWT(t, otherKey, es256k, claims(nil)), "BadJwtSignature"},
		{"a stranger's key", signJWT(t, stranger, es256k, claims(nil)), "BadJwtSignature"},
		{"P-256 under the account's name", signJWT(t, p256, map[string]any{"typ": "JWT", "alg": "ES256"}, claims(nil)), "BadJwtSignature"},
		{"an access token's typ", signJWT(t, key, map[string]any{"typ": "at+jwt", "alg": "ES256K"}, claims(nil)), "BadJwtType"},
		{"alg none", signJWT(t, key, map[string]any{"alg": "none"}, claims(nil)), "BadJwt"},
		{"HS256 bound to the method", signJWT(t, key, map[string]any{"alg": "HS256"}, claims(nil)), "BadJwt"},
		{"iss with a fragment", signJWT(t, key, es256k, claims(map[string]any{"iss": u.did.String() + "#atproto"})), "BadJwtIss"},
		{"iss not hosted here", signJWT(t, stranger, es256k, claims(map[string]any{"iss": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"})), "UntrustedIss"},
	}
	before := e.blobRows(t)
	for _, c := range cases {
		e.uploadWith(t, c.token, "image/png", pngData(t, 100)).fails(t, http.StatusUnauthorized, c.want)
	}
	require.Equal(t, before, e.blobRows(t), "a refused token stores nothing")

	// A deactivated or taken-down account's tokens are refused too.
	deactivated := e.serviceToken(t, u, us, uploadBlobNSID)
	e.post(t, "com.atproto.server.deactivateAccount", u.access, map[string]any{}).ok(t)
	e.uploadWith(t, deactivated, "image/png", pngData(t, 100)).fails(t, http.StatusUnauthorized, "AccountDeactivated")
	takendown := e.serviceToken(t, other, us, uploadBlobNSID)
	e.adminProc(t, "updateSubjectStatus", takedownBody(other.did.String(), true)).ok(t)
	e.uploadWith(t, takendown, "image/png", pngData(t, 100)).fails(t, http.StatusUnauthorized, "AccountTakedown")
	require.Equal(t, before, e.blobRows(t))
}

// TestServiceAuthRefusedElsewhere: a service-auth token is a session on
// uploadBlob only. Every other method that wants a session refuses a
// token bound to it (lxm) and addressed to this server, as it refuses a
// session token that does not verify.
func TestServiceAuthRefusedElsewhere(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{blobs: true})
	u := e.createUser(t)
	var names []string
	for nsid := range e.server.methods {
		names = append(names, nsid)
	}
	sort.Strings(names)
	checked := 0
	for _, nsid := range names {
		m := e.server.methods[nsid]
		if nsid == uploadBlobNSID || strings.HasPrefix(nsid, "_") || nsid == "com.atproto.sync.subscribeRepos" {
			continue
		}
		call := func(token string) (int, string) {
			verb, body := http.MethodGet, io.Reader(nil)
			if m.kind == kindProcedure {
				verb, body = http.MethodPost, strings.NewReader("{}")
			}
			res := e.do(t, verb, nsid, token, body, nil, nil)
			return res.status, errorName(res.body)
		}
		if status, _ := call(""); status != http.StatusUnauthorized {
			continue // no session needed: a token adds nothing
		}
		checked++
		// Minted directly: getServiceAuth refuses protected methods.
		tok, err := e.accounts.ServiceAuthToken(t.Context(), u.did, e.cfg.ServiceDID(), nsid, time.Minute)
		require.NoError(t, err)
		status, name := call(tok)
		require.Contains(t, []int{http.StatusBadRequest, http.StatusUnauthorized}, status, "%s answered %d %s", nsid, status, name)
		require.Contains(t, []string{"InvalidToken", "AuthenticationRequired"}, name, "%s answered %d %s", nsid, status, name)
	}
	t.Logf("%d methods that want a session refused the token", checked)
	require.Greater(t, checked, 20, "the sweep reached the methods that want a session")
}

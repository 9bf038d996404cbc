package pds

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/replay"
)

// signedAs signs claims as a service-auth JWT of did with its signing key
// on e: tokens getServiceAuth would never mint (no jti, long-lived).
func (e *accountEnv) signedAs(t *testing.T, did syntax.DID, claims map[string]any) string {
	t.Helper()
	rot, err := e.cfg.PLCRotationPrivateKey()
	require.NoError(t, err)
	keys, err := account.NewKeyStore(e.pool, rot.Bytes())
	require.NoError(t, err)
	key, err := keys.SigningKey(context.Background(), did)
	require.NoError(t, err)
	hdr, err := json.Marshal(map[string]string{"typ": "JWT", "alg": "ES256K"})
	require.NoError(t, err)
	body, err := json.Marshal(claims)
	require.NoError(t, err)
	b64 := base64.RawURLEncoding
	input := b64.EncodeToString(hdr) + "." + b64.EncodeToString(body)
	sig, err := key.HashAndSign([]byte(input))
	require.NoError(t, err)
	return input + "." + b64.EncodeToString(sig)
}

// migrationClaims are the claims of a createAccount token of u for to,
// live a minute, with a fresh jti.
func migrationClaims(u *user, to *accountEnv) map[string]any {
	jti := make([]byte, 16)
	_, _ = rand.Read(jti)
	now := time.Now()
	return map[string]any{
		"iss": u.did.String(), "aud": to.cfg.ServiceDID(), "lxm": createAccountNSID,
		"iat": now.Unix(), "exp": now.Add(time.Minute).Unix(), "jti": hex.EncodeToString(jti),
	}
}

// TestReplayedMigrationTokenRefused: the service-auth JWT that created an
// account moving in is refused when replayed (401 JwtReplayed), and a
// fresh token does not replace the move in progress either; the account
// keeps its handle, password and session. (A replay was taken for a
// return after a move away and replaced the account.)
func TestReplayedMigrationTokenRefused(t *testing.T) {
	t.Parallel()
	p := newMigrationPair(t, envOptions{})
	u := p.a.createUser(t)
	token := p.a.serviceAuth(t, u, p.b.cfg.ServiceDID(), createAccountNSID)
	victim := p.b.createAccountIn(t, u, "victim"+itoa(int(userSeq.Add(1)))+".test", token, nil).ok(t)
	victimHandle, victimAccess := victim.str(t, "handle"), victim.str(t, "accessJwt")

	mallory := &user{did: u.did, pass: "mallory's password"}
	replayed := p.b.createAccountIn(t, mallory, "mallory"+itoa(int(userSeq.Add(1)))+".test", token, nil)
	msg := replayed.fails(t, http.StatusUnauthorized, "JwtReplayed")
	require.Contains(t, msg, "used already")

	fresh := p.a.serviceAuth(t, u, p.b.cfg.ServiceDID(), createAccountNSID)
	msg = p.b.createAccountIn(t, mallory, "mallory"+itoa(int(userSeq.Add(1)))+".test", fresh, nil).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Contains(t, msg, "did not move away")

	p.b.get(t, "com.atproto.server.getSession", victimAccess, nil).ok(t)
	p.b.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": victimHandle, "password": u.pass}).ok(t)
	p.b.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.did, "password": mallory.pass}).
		fails(t, http.StatusUnauthorized, "AuthenticationRequired")
}

// TestMigrationTokenNeedsJTI: createAccount for an existing DID refuses a
// correctly signed token without a jti, with an unusable one, or living
// longer than an hour (it could not be remembered while it works), and
// stores nothing.
func TestMigrationTokenNeedsJTI(t *testing.T) {
	t.Parallel()
	p := newMigrationPair(t, envOptions{})
	u := p.a.createUser(t)
	for name, edit := range map[string]func(map[string]any){
		"no jti":        func(c map[string]any) { delete(c, "jti") },
		"empty jti":     func(c map[string]any) { c["jti"] = "" },
		"long jti":      func(c map[string]any) { c["jti"] = strings.Repeat("j", replay.MaxIDLen+1) },
		"jti not ASCII": func(c map[string]any) { c["jti"] = "jti with spaces" },
		"two hours":     func(c map[string]any) { c["exp"] = time.Now().Add(2 * time.Hour).Unix() },
	} {
		claims := migrationClaims(u, p.b)
		edit(claims)
		token := p.a.signedAs(t, u.did, claims)
		msg := p.b.createAccountIn(t, u, "jti"+itoa(int(userSeq.Add(1)))+".test", token, nil).fails(t, http.StatusUnauthorized, "BadJwt")
		t.Logf("%s: %s", name, msg)
	}
	require.Zero(t, p.b.accountRows(t, u.did), "nothing stored")

	// The same claims with a jti work, once.
	token := p.a.signedAs(t, u.did, migrationClaims(u, p.b))
	p.b.createAccountIn(t, u, "jti"+itoa(int(userSeq.Add(1)))+".test", token, nil).ok(t)
}

// TestDeactivatedNotMovedIsKept: an account deactivated by its owner while
// its DID still names this server is not recorded as moved away; after
// its DID moves elsewhere (by another route than this server), a
// createAccount with a fresh token from the new server still does not
// replace it.
func TestDeactivatedNotMovedIsKept(t *testing.T) {
	t.Parallel()
	p := newMigrationPair(t, envOptions{})
	u := p.a.createUser(t)
	out := p.a.serviceAuth(t, u, p.b.cfg.ServiceDID(), createAccountNSID)
	p.a.post(t, "com.atproto.server.deactivateAccount", u.access, map[string]any{}).ok(t)
	res := p.b.createAccountIn(t, u, "there"+itoa(int(userSeq.Add(1)))+".test", out, nil).ok(t)
	nu := &user{did: u.did, handle: res.str(t, "handle"), pass: u.pass, access: res.str(t, "accessJwt")}
	p.moveIdentity(t, u, nu)
	p.b.post(t, "com.atproto.server.activateAccount", nu.access, nil).ok(t)

	token := p.b.serviceAuth(t, nu, p.a.cfg.ServiceDID(), createAccountNSID)
	msg := p.a.createAccountIn(t, nu, "back"+itoa(int(userSeq.Add(1)))+".test", token, nil).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Contains(t, msg, "did not move away")
	p.a.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).ok(t)
}

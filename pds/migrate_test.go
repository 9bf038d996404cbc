package pds

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
)

const (
	nsidSignPLC   = "com.atproto.identity.signPlcOperation"
	nsidSubmitPLC = "com.atproto.identity.submitPlcOperation"
)

// inviteCode makes an invite code on e with the admin password.
func (e *accountEnv) inviteCode(t *testing.T, uses int) string {
	t.Helper()
	h := http.Header{"Authorization": {"Basic " + basic("admin", testAdminPassword)}}
	body := strings.NewReader(`{"useCount": ` + itoa(uses) + `}`)
	return e.do(t, http.MethodPost, "com.atproto.server.createInviteCode", "", body, nil, h).ok(t).str(t, "code")
}

// TestMoveInCreatesDeactivatedAccount: createAccount with a DID and a
// service-auth JWT minted by the account's current server creates it
// deactivated, with an empty repository, and sends nothing to the PLC.
func TestMoveInCreatesDeactivatedAccount(t *testing.T) {
	t.Parallel()
	p := newMigrationPair(t, envOptions{configure: func(c *config.Config) { c.InviteRequired = true }})
	u := p.a.createUser(t)
	p.a.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("before")}).ok(t)
	plcOps := len(p.plc.Log(u.did.String()))

	token := p.a.serviceAuth(t, u, p.b.cfg.ServiceDID(), createAccountNSID)
	p.b.createAccountIn(t, u, "movedin.test", token, nil).fails(t, 400, "InvalidInviteCode")
	require.Zero(t, p.b.accountRows(t, u.did))

	res := p.b.createAccountIn(t, u, "movedin.test", token, map[string]any{"inviteCode": p.b.inviteCode(t, 1)}).ok(t)
	require.Equal(t, u.did.String(), res.str(t, "did"))
	require.NotContains(t, res.json(t), "didDoc", "the DID document still names the old server")
	access := res.str(t, "accessJwt")

	sess := p.b.get(t, "com.atproto.server.getSession", access, nil).ok(t).json(t)
	require.Equal(t, false, sess["active"])
	require.Equal(t, "deactivated", sess["status"])
	st := p.b.get(t, "com.atproto.server.checkAccountStatus", access, nil).ok(t).json(t)
	require.Equal(t, false, st["activated"])
	require.Equal(t, false, st["validDid"], "the DID still points at the old server")
	require.EqualValues(t, 0, st["indexedRecords"])
	require.EqualValues(t, 2, st["repoBlocks"], "an empty MST node and the commit")
	require.NotEmpty(t, st["repoCommit"])
	require.Empty(t, p.b.eventKinds(t, u.did), "nothing is announced before activation")
	require.Len(t, p.plc.Log(u.did.String()), plcOps, "nothing is sent to the PLC directory")
	p.a.get(t, "com.atproto.server.getSession", u.access, nil).ok(t)
	key, err := p.b.accounts.PublicKey(context.Background(), u.did)
	require.NoError(t, err)
	oldKey, err := p.a.accounts.PublicKey(context.Background(), u.did)
	require.NoError(t, err)
	require.NotEqual(t, oldKey.DIDKey(), key.DIDKey(), "the new server has a signing key of its own")
}

// TestMoveInRefusals: a missing, foreign, misdirected, expired or forged
// service-auth JWT is a 401 with a name, and nothing is stored.
func TestMoveInRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newMigrationPair(t, envOptions{})
	u, v := p.a.createUser(t), p.a.createUser(t)
	bDID := p.b.cfg.ServiceDID()
	vToken := p.a.serviceAuth(t, v, bDID, createAccountNSID)
	uToken := p.a.serviceAuth(t, u, bDID, createAccountNSID)
	expired, err := p.a.accounts.ServiceAuthToken(ctx, v.did, bDID, createAccountNSID, -time.Minute)
	require.NoError(t, err)
	forged := vToken[:strings.LastIndex(vToken, ".")] + uToken[strings.LastIndex(uToken, "."):]
	anyMethod, err := p.a.accounts.ServiceAuthToken(ctx, v.did, bDID, "", time.Minute)
	require.NoError(t, err)

	for _, tc := range []struct {
		name, token string
		status      int
		error       string
	}{
		{"no token", "", 401, "AuthenticationRequired"},
		{"a token of another DID", uToken, 401, "AuthenticationRequired"},
		{"another method", p.a.serviceAuth(t, v, bDID, "com.atproto.repo.createRecord"), 401, "BadJwtLexiconMethod"},
		{"no method", anyMethod, 401, "BadJwtLexiconMethod"},
		{"another server", p.a.serviceAuth(t, v, p.a.cfg.ServiceDID(), createAccountNSID), 401, "BadJwtAudience"},
		{"expired", expired, 401, "JwtExpired"},
		{"bad signature", forged, 401, "BadJwtSignature"},
		{"not a JWT", "not-a-jwt", 401, "BadJwt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.b.createAccountIn(t, v, "refused"+itoa(int(userSeq.Add(1)))+".test", tc.token, nil).fails(t, tc.status, tc.error)
		})
	}
	require.Zero(t, p.b.accountRows(t, v.did), "nothing stored")
	require.Empty(t, p.b.eventKinds(t, v.did))

	// An active account is never replaced, not even by its own token.
	self := p.a.serviceAuth(t, u, p.a.cfg.ServiceDID(), createAccountNSID)
	msg := p.a.createAccountIn(t, u, "again"+itoa(int(userSeq.Add(1)))+".test", self, nil).fails(t, 400, "InvalidRequest")
	require.Contains(t, msg, "already has an account")
	p.a.get(t, "com.atproto.server.getSession", u.access, nil).ok(t)
}

// TestPLCOperationMovesIdentity: the old server signs the recommended
// operation with the mailed code, the new one checks and submits it, and
// the DID document then names the new server with its key.
func TestPLCOperationMovesIdentity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newMigrationPair(t, envOptions{})
	u := p.a.createUser(t)
	nu := p.moveIn(t, u)

	creds := p.b.recommended(t, nu)
	bKey, err := p.b.accounts.PublicKey(ctx, u.did)
	require.NoError(t, err)
	require.Equal(t, []any{p.b.accounts.RotationKey()}, creds["rotationKeys"])
	require.Equal(t, []any{"at://" + nu.handle}, creds["alsoKnownAs"])
	require.Equal(t, map[string]any{"atproto": bKey.DIDKey()}, creds["verificationMethods"])
	require.Equal(t, map[string]any{"atproto_pds": map[string]any{"type": "AtprotoPersonalDataServer", "endpoint": p.b.cfg.PublicURL()}}, creds["services"])

	// Activation before the DID moves is refused.
	p.b.post(t, "com.atproto.server.activateAccount", nu.access, nil).fails(t, 400, "InvalidRequest")

	// signPlcOperation needs the mailed code, and uses it once.
	p.a.post(t, nsidSignPLC, u.access, creds).fails(t, 400, "InvalidRequest")
	p.a.post(t, nsidSignPLC, u.access, with(creds, "token", "AAAAA-BBBBB")).fails(t, 400, "InvalidToken")
	code := p.a.plcToken(t, u.did)
	good := signedOp(t, p.a.post(t, nsidSignPLC, u.access, with(creds, "token", code)))
	p.a.post(t, nsidSignPLC, u.access, with(creds, "token", code)).fails(t, 400, "InvalidToken")
	log := p.plc.Log(u.did.String())
	require.Len(t, log, 1, "signing sends nothing")
	require.Equal(t, log[0].CID, good["prev"])

	refuseBadOperations(t, p, u, nu, creds, good)

	p.b.post(t, nsidSubmitPLC, nu.access, map[string]any{"operation": good}).ok(t)
	last := p.lastOp(t, u.did)
	require.Equal(t, p.b.cfg.PublicURL(), last.Services["atproto_pds"].Endpoint)
	require.Equal(t, bKey.DIDKey(), last.VerificationMethods["atproto"])
	require.Equal(t, []string{p.b.accounts.RotationKey()}, last.RotationKeys)
	require.Equal(t, []string{"identity"}, p.b.eventKinds(t, u.did), "#identity after the submission")
	st := p.b.get(t, "com.atproto.server.checkAccountStatus", nu.access, nil).ok(t).json(t)
	require.Equal(t, true, st["validDid"])
	require.Equal(t, false, st["activated"])
	old := p.a.get(t, "com.atproto.server.checkAccountStatus", u.access, nil).ok(t).json(t)
	require.Equal(t, false, old["validDid"], "the old server sees the DID gone")

	// The old server's rotation key is no longer among the DID's: it can
	// sign nothing more for it.
	msg := p.a.signOn(t, u, creds).fails(t, 400, "InvalidRequest")
	require.Contains(t, msg, "rotation key")
}

// refuseBadOperations submits on p.b operations that would not keep the
// account there, each signed by p.a, and a few malformed ones: each is a
// 400 and the PLC log does not change.
func refuseBadOperations(t *testing.T, p *migrationPair, u, nu *user, creds, good map[string]any) {
	t.Helper()
	other, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	otherPub, err := other.PublicKey()
	require.NoError(t, err)
	before := len(p.plc.Log(u.did.String()))
	submit := func(op any) xrpcResult {
		return p.b.post(t, nsidSubmitPLC, nu.access, map[string]any{"operation": op})
	}
	for _, tc := range []struct {
		name, field string
		value       any
		want        string
	}{
		{"drops the new server's rotation key", "rotationKeys", []string{p.a.accounts.RotationKey()}, "rotation key"},
		{"points elsewhere", "services", map[string]any{"atproto_pds": map[string]any{"type": "AtprotoPersonalDataServer", "endpoint": "https://elsewhere.example.com"}}, "endpoint"},
		{"another signing key", "verificationMethods", map[string]any{"atproto": otherPub.DIDKey()}, "signing key"},
		{"the handle not first", "alsoKnownAs", []string{"at://someone.test", "at://" + nu.handle}, "alsoKnownAs"},
	} {
		op := signedOp(t, p.a.signOn(t, u, with(creds, tc.field, tc.value)))
		msg := submit(op).fails(t, 400, "InvalidRequest")
		require.Contains(t, msg, tc.want, tc.name)
	}
	// Malformed: a tombstone, no operation, no signature.
	submit(map[string]any{"type": "plc_tombstone", "prev": good["prev"], "sig": good["sig"]}).fails(t, 400, "InvalidRequest")
	p.b.post(t, nsidSubmitPLC, nu.access, map[string]any{}).fails(t, 400, "InvalidRequest")
	submit(with(good, "sig", nil)).fails(t, 400, "InvalidRequest")
	// Well-formed and hosted here, but signed by no rotation key: the
	// directory refuses it, and the client hears a 400.
	forged, err := signWith(good, other)
	require.NoError(t, err)
	msg := submit(forged).fails(t, 400, "InvalidRequest")
	require.Contains(t, msg, "rejected")
	// App-password sessions do not sign (nor submit: the same rule).
	ap := p.a.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "app"}).ok(t).str(t, "password")
	appAccess := p.a.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": ap}).ok(t).str(t, "accessJwt")
	p.a.post(t, nsidSignPLC, appAccess, with(creds, "token", p.a.plcToken(t, u.did))).fails(t, 400, "InvalidToken")
	require.Len(t, p.plc.Log(u.did.String()), before, "nothing reached the PLC directory")
	require.Empty(t, p.b.eventKinds(t, u.did))
}

// with returns a copy of m with k set to v (nil: removed).
func with(m map[string]any, k string, v any) map[string]any {
	out := make(map[string]any, len(m)+1)
	for key, val := range m {
		out[key] = val
	}
	if v == nil {
		delete(out, k)
	} else {
		out[k] = v
	}
	return out
}

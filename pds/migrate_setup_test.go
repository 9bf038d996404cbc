package pds

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// migrationPair is two servers sharing one verifying PLC directory, for
// moving accounts between them.
type migrationPair struct {
	plc  *plctest.Directory
	a, b *accountEnv
}

// newMigrationPair starts servers a and b (each with blobs on disk) over
// one PLC directory; optsB adjusts b (a firehose, invites).
func newMigrationPair(t *testing.T, optsB envOptions) *migrationPair {
	t.Helper()
	dir := plctest.New()
	a := newAccountEnv(t, envOptions{plcHandler: dir, blobs: true})
	optsB.plcHandler, optsB.blobs = dir, true
	b := newAccountEnv(t, optsB)
	return &migrationPair{plc: dir, a: a, b: b}
}

// serviceAuth asks e for a service-auth JWT of u for aud and lxm.
func (e *accountEnv) serviceAuth(t *testing.T, u *user, aud, lxm string) string {
	t.Helper()
	q := url.Values{"aud": {aud}, "lxm": {lxm}, "exp": {strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)}}
	return e.get(t, "com.atproto.server.getServiceAuth", u.access, q).ok(t).str(t, "token")
}

// createAccountIn is createAccount on to for u's DID with token as
// Bearer; extra adds input fields (inviteCode).
func (to *accountEnv) createAccountIn(t *testing.T, u *user, handle, token string, extra map[string]any) xrpcResult {
	t.Helper()
	in := map[string]any{"did": u.did, "handle": handle, "email": "moved-" + handle + "@example.com", "password": u.pass}
	for k, v := range extra {
		in[k] = v
	}
	return to.post(t, "com.atproto.server.createAccount", token, in)
}

// moveIn creates u's account on p.b with a token minted by p.a, and
// returns it as b's user (deactivated, with b's session).
func (p *migrationPair) moveIn(t *testing.T, u *user) *user {
	t.Helper()
	token := p.a.serviceAuth(t, u, p.b.cfg.ServiceDID(), createAccountNSID)
	handle := "moved" + itoa(int(userSeq.Add(1))) + ".test"
	res := p.b.createAccountIn(t, u, handle, token, nil).ok(t)
	require.Equal(t, u.did.String(), res.str(t, "did"))
	return &user{did: u.did, handle: handle, pass: u.pass, access: res.str(t, "accessJwt"), refresh: res.str(t, "refreshJwt")}
}

// plcToken issues the code requestPlcOperationSignature would mail to did
// on e.
func (e *accountEnv) plcToken(t *testing.T, did syntax.DID) string {
	t.Helper()
	code, err := email.Tokens{}.Issue(context.Background(), e.pool, did, email.PurposePLCOperation)
	require.NoError(t, err)
	return code
}

// recommended is b's getRecommendedDidCredentials for u, as a
// signPlcOperation input (without token).
func (e *accountEnv) recommended(t *testing.T, u *user) map[string]any {
	t.Helper()
	return e.get(t, "com.atproto.identity.getRecommendedDidCredentials", u.access, nil).ok(t).json(t)
}

// signOn asks e (the old server) to sign the operation in for u with a
// fresh mailed code.
func (e *accountEnv) signOn(t *testing.T, u *user, in map[string]any) xrpcResult {
	t.Helper()
	body := map[string]any{"token": e.plcToken(t, u.did)}
	for k, v := range in {
		body[k] = v
	}
	return e.post(t, "com.atproto.identity.signPlcOperation", u.access, body)
}

// signedOp is a signPlcOperation answer's operation.
func signedOp(t *testing.T, r xrpcResult) map[string]any {
	t.Helper()
	op, ok := r.ok(t).json(t)["operation"].(map[string]any)
	require.True(t, ok, "body: %s", r.body)
	return op
}

// moveIdentity signs the recommended operation on p.a and submits it on
// p.b: u's DID document then names b.
func (p *migrationPair) moveIdentity(t *testing.T, oldU, newU *user) {
	t.Helper()
	op := signedOp(t, p.a.signOn(t, oldU, p.b.recommended(t, newU)))
	p.b.post(t, "com.atproto.identity.submitPlcOperation", newU.access, map[string]any{"operation": op}).ok(t)
}

// lastOp is the PLC directory's current operation of did.
func (p *migrationPair) lastOp(t *testing.T, did syntax.DID) *didplc.RegularOp {
	t.Helper()
	log := p.plc.Log(did.String())
	require.NotEmpty(t, log)
	op, ok := log[len(log)-1].Operation.AsOperation().(*didplc.RegularOp)
	require.True(t, ok)
	return op
}

// accountRows counts did's rows in the accounts and repo_roots tables of e.
func (e *accountEnv) accountRows(t *testing.T, did syntax.DID) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT (SELECT count(*) FROM accounts WHERE did = $1) + (SELECT count(*) FROM repo_roots WHERE did = $1)", did.String()).Scan(&n))
	return n
}

// signWith re-signs the operation op (as JSON values) with key.
func signWith(op map[string]any, key atcrypto.PrivateKey) (map[string]any, error) {
	b, err := json.Marshal(op)
	if err != nil {
		return nil, err
	}
	var reg didplc.RegularOp
	if err := json.Unmarshal(b, &reg); err != nil {
		return nil, err
	}
	if err := reg.Sign(key); err != nil {
		return nil, err
	}
	if b, err = json.Marshal(&reg); err != nil {
		return nil, err
	}
	var out map[string]any
	return out, json.Unmarshal(b, &out)
}

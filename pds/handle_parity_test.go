package pds

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// TestMoveInWithOwnDomainHandle: an account moving here may bring a
// handle on a domain of its own, as the reference PDS accepts it: any
// handle that resolves to the DID when createAccount is called. One that
// does not is "External handle did not resolve to DID", and nothing is
// stored, the token still usable.
func TestMoveInWithOwnDomainHandle(t *testing.T) {
	t.Parallel()
	w := newWebWorld(t)
	dir := plctest.New()
	a, b := w.env(t, dir), w.env(t, dir)
	u := a.createUser(t)
	token := a.serviceAuth(t, u, b.cfg.ServiceDID(), createAccountNSID)
	in := map[string]any{"did": u.did, "handle": "Erin.Example.com", "email": "erin@example.com", "password": "erin password"}

	w.dns.SetTXT("_atproto.erin.example.com", "did=did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
	msg := b.post(t, "com.atproto.server.createAccount", token, in).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Contains(t, msg, "External handle did not resolve to DID")
	require.Zero(t, b.accountRows(t, u.did))

	w.dns.SetTXT("_atproto.erin.example.com", "did="+u.did.String())
	res := b.post(t, "com.atproto.server.createAccount", token, in).ok(t)
	require.Equal(t, "erin.example.com", res.str(t, "handle"))

	// A new account (no DID of its own yet) still needs the server's
	// domains.
	b.post(t, "com.atproto.server.createAccount", "", map[string]any{
		"handle": "erin.example.com", "email": "new@example.com", "password": "new password",
	}).fails(t, http.StatusBadRequest, "UnsupportedDomain")
}

// TestAdminUpdateAccountHandleAnyValid: the administrator may give any
// valid handle, as with the reference PDS's allowAnyValid: a reserved
// name under the server's domains, or a domain that resolves to the
// account now; one that does not resolve to it is refused.
func TestAdminUpdateAccountHandleAnyValid(t *testing.T) {
	t.Parallel()
	w := newWebWorld(t)
	e := w.env(t, nil)
	u := e.createUser(t)
	const nsid = "updateAccountHandle"

	e.adminProc(t, nsid, map[string]any{"did": u.did, "handle": "support.test"}).ok(t)
	require.Equal(t, "support.test", e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).str(t, "handle"))
	// The user may not take a reserved name.
	e.post(t, "com.atproto.identity.updateHandle", u.access, map[string]any{"handle": "admin.test"}).fails(t, http.StatusBadRequest, "HandleNotAvailable")

	msg := e.adminProc(t, nsid, map[string]any{"did": u.did, "handle": "erin.example.com"}).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Contains(t, msg, "External handle did not resolve to DID")
	w.dns.SetTXT("_atproto.erin.example.com", "did="+u.did.String())
	e.adminProc(t, nsid, map[string]any{"did": u.did, "handle": "erin.example.com"}).ok(t)
	require.Equal(t, "erin.example.com", e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).str(t, "handle"))
	log := e.plc.Log(u.did.String())
	require.Equal(t, []string{"at://erin.example.com"}, log[len(log)-1].Operation.Regular.AlsoKnownAs)
	e.adminProc(t, nsid, map[string]any{"did": u.did, "handle": "a.b.test"}).fails(t, http.StatusBadRequest, "InvalidHandle")
}

package lexresolve

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/devdns"
	"github.com/bulwark-pds/bulwark/outbound"
)

const (
	didPub   = "did:plc:pub00000000000000000000a"
	setNSID  = "test.example.authBasic"
	setDNS   = "_lexicon.example.test"
	otherDID = "did:plc:other000000000000000000"
)

// env is a DNS server and a publisher's PDS on this machine, and a
// resolver that reaches them through the guarded outbound client.
type env struct {
	dns *devdns.Server
	pub *publisher
	res *Resolver
}

func newEnv(t *testing.T) *env {
	t.Helper()
	d, err := devdns.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(d.Close)
	pub := newPublisher(t, didPub)
	pub.publish(setNSID, map[string]any{"main": map[string]any{"type": "permission-set", "title": "Basic", "permissions": []any{}}})
	d.SetTXT(setDNS, "did="+didPub)
	web := outbound.New(outbound.Config{Resolver: d.Resolver(), AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	return &env{dns: d, pub: pub, res: New(web, dids{pub.did: pub.document()})}
}

func (e *env) resolve(t *testing.T, nsid string) (*Schema, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return e.res.Resolve(ctx, syntax.NSID(nsid))
}

// TestResolve: the authority's TXT record names the DID, whose PDS serves
// the record with a proof that verifies; the document comes back as JSON
// with where it was found.
func TestResolve(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Other records in the repository make the tree more than one node.
	for i := range 60 {
		e.pub.put("app.example.post/"+syntax.NewTIDNow(uint(i)).String(), map[string]any{"$type": "app.example.post", "n": i})
	}
	s, err := e.resolve(t, setNSID)
	require.NoError(t, err)
	require.Equal(t, syntax.ATURI("at://"+didPub+"/com.atproto.lexicon.schema/"+setNSID), s.URI)
	var doc struct {
		ID   string `json:"id"`
		Defs struct {
			Main struct {
				Type  string `json:"type"`
				Title string `json:"title"`
			} `json:"main"`
		} `json:"defs"`
	}
	require.NoError(t, json.Unmarshal(s.Document, &doc))
	require.Equal(t, setNSID, doc.ID)
	require.Equal(t, "permission-set", doc.Defs.Main.Type)
	require.Equal(t, "Basic", doc.Defs.Main.Title)
	_, err = cid.Decode(s.CID)
	require.NoError(t, err)
	require.Equal(t, 1, e.dns.Queries(setDNS+"."), "one TXT question")
}

// TestResolveNotPublished: no TXT record, a DID that does not resolve, and
// a repository without the record are all ErrNotFound; a DNS server that
// fails is ErrFailed.
func TestResolveNotPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := e.resolve(t, "test.nowhere.authX")
	require.ErrorIs(t, err, ErrNotFound)

	e.dns.SetTXT("_lexicon.unknown.test", "did="+otherDID)
	_, err = e.resolve(t, "test.unknown.authX")
	require.ErrorIs(t, err, ErrNotFound)

	_, err = e.resolve(t, "test.example.authMissing")
	require.ErrorIs(t, err, ErrNotFound)
}

// TestResolveRefusesForgeries: a proof must verify in every part.
func TestResolveRefusesForgeries(t *testing.T) {
	t.Parallel()
	for name, forge := range map[string]func(t *testing.T, p *publisher){
		"signed with another key": func(t *testing.T, p *publisher) {
			k, err := atcrypto.GeneratePrivateKeyK256()
			require.NoError(t, err)
			p.signer = k
		},
		"commit of another repository": func(t *testing.T, p *publisher) { p.commitDID = otherDID },
		"record bytes changed": func(t *testing.T, p *publisher) {
			p.tamper = func(pr *proof) {
				for i, b := range pr.blocks {
					if b.Cid().Equals(pr.record) {
						data := bytes.Replace(b.RawData(), []byte("Basic"), []byte("Evil!"), 1)
						pr.blocks[i] = rawBlock(t, b.Cid(), data)
					}
				}
			}
		},
		"node on the path left out": func(t *testing.T, p *publisher) {
			// Enough records that the set's key is below the root.
			for i := range 200 {
				p.put("app.example.post/"+syntax.NewTIDNow(uint(i)).String(), map[string]any{"$type": "app.example.post"})
			}
			require.Zero(t, mst.HeightForKey([]byte(SchemaCollection+"/"+setNSID)))
			p.tamper = func(pr *proof) {
				inner := map[cid.Cid]bool{}
				for _, c := range pr.mstNodes[1:] {
					inner[c] = true
				}
				pr.without(func(c cid.Cid) bool { return inner[c] })
			}
		},
		"record left out": func(t *testing.T, p *publisher) {
			p.tamper = func(pr *proof) { pr.without(func(c cid.Cid) bool { return c.Equals(pr.record) }) }
		},
		"id is another NSID": func(t *testing.T, p *publisher) {
			p.put(SchemaCollection+"/"+setNSID, map[string]any{"$type": SchemaCollection, "lexicon": 1, "id": "test.example.other", "defs": map[string]any{}})
		},
		"not a lexicon record": func(t *testing.T, p *publisher) {
			p.put(SchemaCollection+"/"+setNSID, map[string]any{"$type": "app.example.post", "lexicon": 1, "id": setNSID})
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			forge(t, e.pub)
			_, err := e.resolve(t, setNSID)
			require.ErrorIs(t, err, ErrInvalid)
		})
	}
}

// TestResolveGuarded: a PDS on an address the outbound client may not
// reach is never contacted; the lexicon is not found.
func TestResolveGuarded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	web := outbound.New(outbound.Config{Resolver: e.dns.Resolver()})
	e.res = New(web, dids{e.pub.did: e.pub.document()})
	_, err := e.resolve(t, setNSID)
	require.ErrorIs(t, err, ErrNotFound)
	require.True(t, outbound.Refused(err), "%v", err)
}

// TestResolveSlowDNS: a DNS server that does not answer costs the
// caller's deadline, then fails.
func TestResolveSlowDNS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	release := e.dns.Hold(setDNS)
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := e.res.Resolve(ctx, syntax.NSID(setNSID))
	require.ErrorIs(t, err, ErrFailed)
}

// TestResolveOversizedProof: a proof larger than MaxProofBytes is not read
// past the limit.
func TestResolveOversizedProof(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.pub.publish(setNSID, map[string]any{"main": map[string]any{"type": "permission-set", "title": strings.Repeat("x", MaxProofBytes)}})
	_, err := e.resolve(t, setNSID)
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, err, outbound.ErrResponseTooLarge)
}

// TestResolveSlowPDS: a PDS that never answers costs the caller's
// deadline, then fails.
func TestResolveSlowPDS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stuck := make(chan struct{})
	defer close(stuck)
	e.pub.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stuck:
		case <-r.Context().Done():
			panic(http.ErrAbortHandler) // no answer racing the caller's give-up
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := e.res.Resolve(ctx, syntax.NSID(setNSID))
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

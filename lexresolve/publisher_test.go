package lexresolve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	"github.com/ipld/go-car"
	carutil "github.com/ipld/go-car/util"
	"github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"
)

// publisher is an account's repository served by a PDS that answers
// com.atproto.sync.getRecord with proof CARs, built with indigo's MST and
// commit types as a PDS builds them. Its proofs carry the whole
// repository (a valid proof, larger than needed); tamper adjusts them.
type publisher struct {
	t       *testing.T
	did     syntax.DID
	key     atcrypto.PrivateKey
	records map[string]map[string]any // path -> record
	srv     *httptest.Server

	mu sync.Mutex
	// tamper, when set, changes the proof before it is sent.
	tamper func(p *proof)
	// signer, when set, signs commits instead of key.
	signer atcrypto.PrivateKey
	// commitDID, when set, is the commit's DID instead of did.
	commitDID string
}

// proof is a proof CAR under construction.
type proof struct {
	root   cid.Cid
	blocks []blocks.Block
	// mstNodes are the CIDs of the tree's nodes, root first.
	mstNodes []cid.Cid
	record   cid.Cid
}

func newPublisher(t *testing.T, did string) *publisher {
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	p := &publisher{t: t, did: syntax.DID(did), key: key, records: map[string]map[string]any{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /xrpc/com.atproto.sync.getRecord", p.serveGetRecord)
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

// document is the DID document naming the publisher's PDS and key.
func (p *publisher) document() *identity.DIDDocument {
	pub, err := p.key.PublicKey()
	require.NoError(p.t, err)
	return &identity.DIDDocument{
		DID: p.did,
		VerificationMethod: []identity.DocVerificationMethod{{
			ID: p.did.String() + "#atproto", Type: "Multikey", Controller: p.did.String(), PublicKeyMultibase: pub.Multibase(),
		}},
		Service: []identity.DocService{{ID: "#atproto_pds", Type: "AtprotoPersonalDataServer", ServiceEndpoint: p.srv.URL}},
	}
}

// publish stores a lexicon schema record for nsid with the given defs.
func (p *publisher) publish(nsid string, defs map[string]any) {
	p.put(SchemaCollection+"/"+nsid, map[string]any{"$type": SchemaCollection, "lexicon": int64(1), "id": nsid, "defs": defs})
}

// put stores a record at path; data goes through JSON, as a record
// written over XRPC does.
func (p *publisher) put(path string, rec map[string]any) {
	b, err := json.Marshal(rec)
	require.NoError(p.t, err)
	d, err := atdata.UnmarshalJSON(b)
	require.NoError(p.t, err)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.records[path] = d
}

func (p *publisher) serveGetRecord(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path := q.Get("collection") + "/" + q.Get("rkey")
	p.mu.Lock()
	_, ok := p.records[path]
	p.mu.Unlock()
	if q.Get("did") != p.did.String() || !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"RecordNotFound","message":"Could not locate record"}`))
		return
	}
	w.Header().Set("Content-Type", "application/vnd.ipld.car")
	_, _ = w.Write(p.proofCAR(path))
}

// proofCAR builds the repository and its proof for path.
func (p *publisher) proofCAR(path string) []byte {
	t := p.t
	ctx := context.Background()
	p.mu.Lock()
	defer p.mu.Unlock()
	pr := &proof{}
	tree := mst.NewEmptyTree()
	for k, rec := range p.records {
		b, err := atdata.MarshalCBOR(rec)
		require.NoError(t, err)
		blk := cborBlock(t, b)
		pr.blocks = append(pr.blocks, blk)
		_, err = tree.Insert([]byte(k), blk.Cid())
		require.NoError(t, err)
		if k == path {
			pr.record = blk.Cid()
		}
	}
	col := &collector{}
	root, err := tree.WriteDiffBlocks(ctx, col)
	require.NoError(t, err)
	pr.mstNodes = []cid.Cid{*root}
	for _, b := range col.blocks {
		if !b.Cid().Equals(*root) {
			pr.mstNodes = append(pr.mstNodes, b.Cid())
		}
	}
	pr.blocks = append(pr.blocks, col.blocks...)
	did := p.did.String()
	if p.commitDID != "" {
		did = p.commitDID
	}
	commit := repo.Commit{DID: did, Version: repo.ATPROTO_REPO_VERSION, Data: *root, Rev: syntax.NewTIDNow(0).String()}
	signer := p.key
	if p.signer != nil {
		signer = p.signer
	}
	require.NoError(t, commit.Sign(signer))
	var cb bytes.Buffer
	require.NoError(t, commit.MarshalCBOR(&cb))
	cblk := cborBlock(t, cb.Bytes())
	pr.root = cblk.Cid()
	pr.blocks = append([]blocks.Block{cblk}, pr.blocks...)
	if p.tamper != nil {
		p.tamper(pr)
	}
	var out bytes.Buffer
	require.NoError(t, car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{pr.root}, Version: 1}, &out))
	for _, b := range pr.blocks {
		require.NoError(t, carutil.LdWrite(&out, b.Cid().Bytes(), b.RawData()))
	}
	return out.Bytes()
}

func cborBlock(t *testing.T, data []byte) blocks.Block {
	c, err := cid.V1Builder{Codec: cid.DagCBOR, MhType: multihash.SHA2_256}.Sum(data)
	require.NoError(t, err)
	blk, err := blocks.NewBlockWithCid(data, c)
	require.NoError(t, err)
	return blk
}

// without returns the blocks but those for which drop holds.
func (pr *proof) without(drop func(cid.Cid) bool) {
	var kept []blocks.Block
	for _, b := range pr.blocks {
		if !drop(b.Cid()) {
			kept = append(kept, b)
		}
	}
	pr.blocks = kept
}

// collector is the part of a blockstore WriteDiffBlocks uses.
type collector struct{ blocks []blocks.Block }

var errCollector = errors.New("not supported")

func (c *collector) Put(_ context.Context, b blocks.Block) error {
	c.blocks = append(c.blocks, b)
	return nil
}
func (c *collector) PutMany(ctx context.Context, bs []blocks.Block) error {
	c.blocks = append(c.blocks, bs...)
	return nil
}
func (c *collector) Has(context.Context, cid.Cid) (bool, error)          { return false, nil }
func (c *collector) Get(context.Context, cid.Cid) (blocks.Block, error)  { return nil, errCollector }
func (c *collector) GetSize(context.Context, cid.Cid) (int, error)       { return 0, errCollector }
func (c *collector) DeleteBlock(context.Context, cid.Cid) error          { return errCollector }
func (c *collector) AllKeysChan(context.Context) (<-chan cid.Cid, error) { return nil, errCollector }
func (c *collector) HashOnRead(bool)                                     {}

// dids resolves the DIDs of publishers.
type dids map[syntax.DID]*identity.DIDDocument

func (d dids) ResolveDID(_ context.Context, did syntax.DID) (*identity.DIDDocument, error) {
	if doc, ok := d[did]; ok {
		return doc, nil
	}
	return nil, identity.ErrDIDNotFound
}

// rawBlock is data under c, whether or not it hashes to it.
func rawBlock(t *testing.T, c cid.Cid, data []byte) blocks.Block {
	blk, err := blocks.NewBlockWithCid(data, c)
	require.NoError(t, err)
	return blk
}

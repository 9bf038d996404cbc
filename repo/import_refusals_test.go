package repo_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	cbor "github.com/ipfs/go-ipld-cbor"
	"github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

func writeCAR(t testing.TB, roots []cid.Cid, blocks ...repotest.Block) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, repotest.WriteCAR(&buf, roots, blocks...))
	return buf.Bytes()
}

// keyAtHeight finds a record path whose MST height is h.
func keyAtHeight(h int, from int) string {
	for i := from; ; i++ {
		k := fmt.Sprintf("app.bsky.feed.post/k%06d", i)
		if mst.HeightForKey([]byte(k)) == h {
			return k
		}
	}
}

// badCARs builds the refused inputs, each with what the error must say.
func badCARs(t testing.TB, e *importEnv) map[string]struct {
	car  []byte
	want string
} {
	ctx := context.Background()
	_ = ctx
	good := repotest.RepoCAR(t, e.did, e.oldKey, oldRev, samplePosts(50))
	roots, blocks := repotest.SplitCAR(t, good)
	commit := blocks[0]
	// blocks: commit, MST nodes, then records (WriteRepoCAR's order).
	last := blocks[len(blocks)-1]
	firstNode := blocks[1]

	tampered := append([]repotest.Block(nil), blocks...)
	data := bytes.Clone(last.Data)
	data[len(data)-1] ^= 1
	tampered[len(tampered)-1] = repotest.Block{CID: last.CID, Data: data}

	otherDID := repotest.RepoCAR(t, syntax.DID("did:plc:someoneelse"), e.oldKey, oldRev, samplePosts(2))
	future := repotest.RepoCAR(t, e.did, e.oldKey, syntax.NewTID(time.Now().Add(24*time.Hour).UnixMicro(), 0).String(), samplePosts(2))

	// A root node holding keys of two different heights.
	k0, k1 := keyAtHeight(0, 0), keyAtHeight(1, 0)
	if k1 < k0 {
		k0, k1 = k1, k0
	}
	rec := repotest.CBORBlock(mustCBOR(t, postRecord("x")))
	p := mst.CountPrefixLen([]byte(k0), []byte(k1))
	nd := mst.NodeData{Entries: []mst.EntryData{
		{KeySuffix: []byte(k0), Value: rec.CID},
		{PrefixLen: int64(p), KeySuffix: []byte(k1)[p:], Value: rec.CID},
	}}
	ndBytes, ndCID, err := nd.Bytes()
	require.NoError(t, err)
	badTree, err := repotest.Commit(e.did, *ndCID, oldRev, e.oldKey)
	require.NoError(t, err)

	float := repotest.RepoCARBlocks(t, e.did, e.oldKey, oldRev, map[string][]byte{
		"app.bsky.feed.post/3float": mustCBOR(t, map[string]any{"$type": "app.bsky.feed.post", "n": 1.5}),
	})
	noType := repotest.RepoCARBlocks(t, e.did, e.oldKey, oldRev, map[string][]byte{
		"app.bsky.feed.post/3notype": mustCBOR(t, map[string]any{"text": "hi"}),
	})
	raw, err := cid.NewPrefixV1(cid.Raw, multihash.SHA2_256).Sum([]byte("raw"))
	require.NoError(t, err)

	return map[string]struct {
		car  []byte
		want string
	}{
		"two roots":          {writeCAR(t, []cid.Cid{roots[0], last.CID}, blocks...), "2 roots"},
		"no root":            {writeCAR(t, nil, blocks...), "0 roots"},
		"block mismatch":     {writeCAR(t, roots, tampered...), "bytes of block " + last.CID.String() + " do not match its CID"},
		"truncated":          {good[:len(good)-7], "truncated"},
		"truncated header":   {good[:10], "truncated"},
		"commit of another":  {otherDID, "is for did:plc:someoneelse, not for this account"},
		"rev in the future":  {future, "in the future"},
		"missing record":     {writeCAR(t, roots, blocks[:len(blocks)-1]...), "lacks the block " + last.CID.String()},
		"missing node":       {writeCAR(t, roots, append([]repotest.Block{commit}, blocks[2:]...)...), "lacks MST node " + firstNode.CID.String()},
		"missing commit":     {writeCAR(t, roots, blocks[1:]...), "does not hold its root block"},
		"empty body":         {nil, "body is empty"},
		"not a CAR":          {[]byte("\x05hello world"), "not a CAR"},
		"wrong height":       {writeCAR(t, []cid.Cid{badTree.CID}, badTree, repotest.Block{CID: *ndCID, Data: ndBytes}, rec), "belongs at height"},
		"float in a record":  {float, "not valid atproto data"},
		"record sans $type":  {noType, "has no $type"},
		"raw block":          {writeCAR(t, roots, append(blocks, repotest.Block{CID: raw, Data: []byte("raw")})...), "repository blocks are DAG-CBOR with SHA-256"},
		"huge block section": {append(writeCAR(t, roots), 0xff, 0xff, 0xff, 0x7f), "the largest accepted is"},
	}
}

func mustCBOR(t testing.TB, v map[string]any) []byte {
	t.Helper()
	b, err := cbor.DumpObject(v)
	require.NoError(t, err)
	return b
}

// TestImportRefusals feeds malformed repositories to Import: each is an
// ErrInvalidImport naming the problem, and nothing is stored.
func TestImportRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newImportEnv(t)
	before := e.snapshot(t)
	for name, c := range badCARs(t, e) {
		t.Run(name, func(t *testing.T) {
			_, err := e.engine.Import(ctx, e.did, bytes.NewReader(c.car), repo.ImportOptions{})
			require.ErrorIs(t, err, repo.ErrInvalidImport)
			require.Contains(t, err.Error(), c.want)
			require.Equal(t, before, e.snapshot(t), "nothing stored")
			require.Zero(t, e.stagingTables(t), "no staging left behind")
		})
	}
}

// countReader counts what Import read of a body.
type countReader struct {
	r io.Reader
	n int
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestImportSizeLimit: a CAR over the limit is refused once the stream
// passes it, without reading the rest, and nothing is stored.
func TestImportSizeLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newImportEnv(t)
	big := repotest.RepoCAR(t, e.did, e.oldKey, oldRev, samplePosts(5000))
	require.Greater(t, len(big), 400<<10)
	before := e.snapshot(t)
	body := &countReader{r: bytes.NewReader(big)}
	const limit = 32 << 10
	_, err := e.engine.Import(ctx, e.did, body, repo.ImportOptions{MaxBytes: limit})
	var tl *repo.ImportTooLargeError
	require.ErrorAs(t, err, &tl)
	require.ErrorIs(t, err, repo.ErrImportTooLarge)
	require.EqualValues(t, limit, tl.Max)
	// The reader reads ahead at most one 64 KiB buffer.
	require.LessOrEqual(t, body.n, limit+64<<10, "stopped reading at the limit")
	require.Equal(t, before, e.snapshot(t))

	// A reader that fails is ErrImportRead.
	_, err = e.engine.Import(ctx, e.did, io.MultiReader(bytes.NewReader(big[:1000]), errReader{}), repo.ImportOptions{})
	require.ErrorIs(t, err, repo.ErrImportRead)
	require.Equal(t, before, e.snapshot(t))
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// TestImportUnknownRepo: an account without a repository.
func TestImportUnknownRepo(t *testing.T) {
	t.Parallel()
	e := newImportEnv(t)
	did := syntax.DID("did:plc:nobody")
	e.keys.Add(t, did)
	_, err := e.engine.Import(context.Background(), did, bytes.NewReader(repotest.RepoCAR(t, did, e.oldKey, oldRev, samplePosts(1))), repo.ImportOptions{})
	require.ErrorIs(t, err, repo.ErrRepoNotFound)
}

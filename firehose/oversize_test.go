package firehose_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/ipfs/go-cid"
	car "github.com/ipld/go-car"
	carutil "github.com/ipld/go-car/util"
	"github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/limits"
	"github.com/bulwark-pds/bulwark/repo"
)

// padBlocks appends a filler block to a commit's CAR until it holds size
// bytes, keeping the commit as first root (what an import or a legacy
// server could have stored).
func padBlocks(t *testing.T, blocks []byte, size int) []byte {
	t.Helper()
	filler := bytes.Repeat([]byte{0xa0}, size-len(blocks)-40)
	c, err := cid.NewPrefixV1(cid.Raw, multihash.SHA2_256).Sum(filler)
	require.NoError(t, err)
	var buf bytes.Buffer
	buf.Write(blocks)
	require.NoError(t, carutil.LdWrite(&buf, c.Bytes(), filler))
	return buf.Bytes()
}

// storeOversized stores a copy of a real #commit of did with its blocks
// padded past the relay limit (but under cbor-gen's 2 MiB).
func storeOversized(t *testing.T, b *bundle, ev eventlog.Event) {
	t.Helper()
	var c comatproto.SyncSubscribeRepos_Commit
	require.NoError(t, c.UnmarshalCBOR(bytes.NewReader(ev.Body)))
	c.Blocks = padBlocks(t, c.Blocks, 2_050_000)
	enc, err := eventlog.EncodeCommit(&c)
	require.NoError(t, err)
	require.Greater(t, enc.BlocksLen, 2_000_000)
	b.appendEvent(t, enc)
}

func TestOversizedCommitServedAsSync(t *testing.T) {
	t.Parallel()
	for _, disabled := range []bool{false, true} {
		t.Run(map[bool]string{false: "fallback on", true: "fallback off"}[disabled], func(t *testing.T) {
			t.Parallel()
			b := setup(t, options{hub: firehose.Config{DisableOversizeSync: disabled}})
			did := b.newRepo(t)
			b.write(t, did, "real")
			b.waitSequenced(t, 2)
			all := b.allEvents(t)
			storeOversized(t, b, all[1])
			b.write(t, did, "after")
			last := b.waitSequenced(t, 4)

			conn := dial(t, b.wsURL, ptr(int64(0)))
			got := readUntil(t, conn, last)
			require.Len(t, got, 4)
			big := got[2]
			if disabled {
				require.Equal(t, "#commit", big.kind, "with the fallback off the event goes out as stored")
				require.Greater(t, len(big.commit.Blocks), 2_000_000)
				return
			}
			require.Equal(t, "#sync", big.kind)
			require.Equal(t, did.String(), big.sync.Did)
			require.Equal(t, got[1].commit.Rev, big.sync.Rev)
			require.Less(t, len(big.sync.Blocks), limits.MaxSyncBlocksBytes)
			commit, _, err := atrepo.LoadCommitFromCAR(context.Background(), bytes.NewReader(big.sync.Blocks))
			require.NoError(t, err)
			require.Equal(t, big.sync.Rev, commit.Rev)
			require.NoError(t, commit.VerifySignature(b.keys.Public(t, did)))
			cr, err := car.NewCarReader(bytes.NewReader(big.sync.Blocks))
			require.NoError(t, err)
			require.Equal(t, cid.Cid(got[1].commit.Commit).String(), cr.Header.Roots[0].String())
			// Live subscribers get the same treatment.
			require.Equal(t, "#commit", got[3].kind)
			b.verifyCommit(t, got[3].commit)
		})
	}
}

// TestIncidentReadsBeforeFirstFrame replays the incident's cursor: a
// 1.9 MB commit at the cursor. Resolving the cursor reads only seqs and
// times; the one page read before the first frame starts after the cursor.
func TestIncidentReadsBeforeFirstFrame(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noSequencer: true, hub: firehose.Config{PollInterval: time.Hour}})
	did := b.newRepo(t)
	text := func(c byte) map[string]any {
		return map[string]any{"$type": "app.bsky.feed.post", "text": strings.Repeat(string(c), 950_000), "createdAt": "2026-11-29T00:00:00Z"}
	}
	_, err := b.engine.Apply(context.Background(), did, []repo.Write{
		{Action: repo.ActionCreate, Collection: "app.bsky.feed.post", Record: text('a')},
		{Action: repo.ActionCreate, Collection: "app.bsky.feed.post", Record: text('b')},
	}, nil)
	require.NoError(t, err)
	b.write(t, did, "small")
	last := b.sequenceAll(t)
	all := b.allEvents(t)
	bigEv := all[1]
	require.Greater(t, bigEv.BlocksLen, 1_900_000)
	require.Less(t, bigEv.BlocksLen, 2_000_000)

	// The subscription's own statements: the hub's reads for its live
	// fan-out are not counted.
	subscriptionQueries := b.queries.subscriptionsSince

	m := b.queries.mark()
	conn := dial(t, b.wsURL, ptr(bigEv.Seq))
	f, err := readFrame(t, conn)
	require.NoError(t, err)
	require.Equal(t, last, f.seq)
	// Before the first frame: last seq, cursor point, one page. (The
	// subscription may already be reading its next page: the frame was
	// taken.)
	requireFirstReads := func(qs []string) {
		t.Helper()
		require.GreaterOrEqual(t, len(qs), 3, "%q", qs)
		require.Contains(t, qs[0], "sequencer_state")
		require.Contains(t, qs[1], "SELECT seq, created_at FROM events")
		require.Contains(t, qs[2], "octet_length")
	}
	requireFirstReads(subscriptionQueries(m))

	// With the cursor just before it, the big commit is the first frame and
	// the only event read.
	m = b.queries.mark()
	conn = dial(t, b.wsURL, ptr(bigEv.Seq-1))
	f, err = readFrame(t, conn)
	require.NoError(t, err)
	require.Equal(t, bigEv.Seq, f.seq)
	require.Equal(t, "#commit", f.kind)
	b.verifyCommit(t, f.commit)
	requireFirstReads(subscriptionQueries(m))
}

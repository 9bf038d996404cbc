package eventlog

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"
	car "github.com/ipld/go-car"
	carutil "github.com/ipld/go-car/util"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/limits"
)

// oversizedCommit stores, as a bug or an import could, a #commit whose
// blocks are filler bytes over every relay limit, plus a signed commit block
// as its first root. It returns the event's seq.
func oversizedCommit(t *testing.T, pool *pgxpool.Pool, did string, filler int) (int64, *atrepo.Commit) {
	t.Helper()
	ctx := context.Background()
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	pref := cid.NewPrefixV1(cid.DagCBOR, multihash.SHA2_256)
	dataCID, err := pref.Sum([]byte("not really an mst"))
	require.NoError(t, err)
	commit := &atrepo.Commit{DID: did, Version: 3, Data: dataCID, Rev: syntax.NewTIDNow(0).String()}
	require.NoError(t, commit.Sign(key))
	var cb bytes.Buffer
	require.NoError(t, commit.MarshalCBOR(&cb))
	commitCID, err := pref.Sum(cb.Bytes())
	require.NoError(t, err)
	big := bytes.Repeat([]byte{0xa0}, filler)
	marker := []byte("BLOCKS-PLACEHOLDER:") // under 24 bytes: a one-byte head
	bigCID, err := cid.NewPrefixV1(cid.Raw, multihash.SHA2_256).Sum(big)
	require.NoError(t, err)
	var carBuf bytes.Buffer
	require.NoError(t, car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{commitCID}, Version: 1}, &carBuf))
	require.NoError(t, carutil.LdWrite(&carBuf, commitCID.Bytes(), cb.Bytes()))
	require.NoError(t, carutil.LdWrite(&carBuf, bigCID.Bytes(), big))
	// cbor-gen refuses byte strings over 2 MiB, so encode with a marker and
	// splice the real blocks in: the kind of body only a bug or an import
	// produces.
	enc, err := EncodeCommit(&comatproto.SyncSubscribeRepos_Commit{
		Repo: did, Commit: lexutil.LexLink(commitCID), Rev: commit.Rev, Blocks: marker,
		Ops: []*comatproto.SyncSubscribeRepos_RepoOp{}, Blobs: []lexutil.LexLink{}, Time: syntax.DatetimeNow().String(),
	})
	require.NoError(t, err)
	at := bytes.Index(enc.Body, marker) - 1
	require.Greater(t, at, enc.SeqOffset)
	var bhead []byte
	bhead = append(bhead, 0x5a) // byte string, 4-byte length
	bhead = binary.BigEndian.AppendUint32(bhead, uint32(carBuf.Len()))
	enc.Body = append(append(append([]byte{}, enc.Body[:at]...), bhead...), append(carBuf.Bytes(), enc.Body[at+1+len(marker):]...)...)
	enc.BlocksLen = carBuf.Len()
	require.NoError(t, Append(ctx, pool, enc))
	seq := NewSequencer(pool, SequencerConfig{})
	_, err = seq.SequenceBatch(ctx)
	require.NoError(t, err)
	last, err := NewLog(pool).LastSeq(ctx)
	require.NoError(t, err)
	return last, commit
}

func TestRewriteAsSyncAndInvalidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	log := NewLog(pool)
	seq, commit := oversizedCommit(t, pool, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", 5_100_000)
	okSeq, _ := oversizedCommit(t, pool, "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", 1000)

	bad, err := log.Inspect(ctx, EventFilter{OverLimits: true})
	require.NoError(t, err)
	require.Len(t, bad, 1)
	require.Equal(t, seq, bad[0].Seq)
	require.Greater(t, bad[0].FrameBytes, limits.MaxFrameBytes)
	require.Len(t, bad[0].Problems, 2, "frame and blocks limits")

	res, err := log.RewriteAsSync(ctx, seq, "admin", "relays stuck at this seq")
	require.NoError(t, err)
	require.True(t, res.Changed)
	require.Equal(t, KindSync, res.After.Kind)
	require.Empty(t, res.After.Problems)

	again, err := log.RewriteAsSync(ctx, seq, "admin", "twice")
	require.NoError(t, err)
	require.False(t, again.Changed, "a second rewrite changes nothing")

	// The stored event is now a #sync of the same repo and rev whose CAR
	// holds the signed commit only, at the same seq.
	evs, err := log.After(ctx, seq-1, 1)
	require.NoError(t, err)
	require.Equal(t, seq, evs[0].Seq)
	require.Equal(t, KindSync, evs[0].Kind)
	var s comatproto.SyncSubscribeRepos_Sync
	frame := AppendFrame(nil, evs[0].Kind, evs[0].Body, evs[0].SeqOffset, evs[0].Seq)
	require.NoError(t, s.UnmarshalCBOR(bytes.NewReader(frame[len(headerBytes[KindSync]):])))
	require.Equal(t, seq, s.Seq)
	require.Equal(t, commit.Rev, s.Rev)
	got, _, err := atrepo.LoadCommitFromCAR(ctx, bytes.NewReader(s.Blocks))
	require.NoError(t, err)
	require.Equal(t, commit.Sig, got.Sig)
	require.LessOrEqual(t, len(s.Blocks), limits.MaxSyncBlocksBytes)

	_, err = log.RewriteAsSync(ctx, 999999, "admin", "")
	require.ErrorIs(t, err, ErrNoEvent)

	inv, err := log.Invalidate(ctx, okSeq, "admin", "bad data")
	require.NoError(t, err)
	require.True(t, inv.Changed)
	inv, err = log.Invalidate(ctx, okSeq, "admin", "bad data")
	require.NoError(t, err)
	require.False(t, inv.Changed)
	evs, err = log.After(ctx, seq, 10)
	require.NoError(t, err)
	require.Empty(t, evs, "invalidated events are not served")

	before, after, err := log.RaiseSeqAudited(ctx, 5000, "admin", "restore")
	require.NoError(t, err)
	require.Equal(t, okSeq, before)
	require.Equal(t, int64(5000), after)
	_, after2, err := log.RaiseSeqAudited(ctx, 10, "admin", "no-op")
	require.NoError(t, err)
	require.Equal(t, int64(5000), after2, "raising never lowers")

	entries, err := audit.List(ctx, pool, "", 0, 100)
	require.NoError(t, err)
	require.Len(t, entries, 3, "one audit entry per change, none for no-ops")
}

func TestRepairOversized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	log := NewLog(pool)
	a, _ := oversizedCommit(t, pool, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", 2_100_000)
	oversizedCommit(t, pool, "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", 100)
	c, _ := oversizedCommit(t, pool, "did:plc:cccccccccccccccccccccccc", 3_000_000)
	fixed, err := log.RepairOversized(ctx, "admin", "sweep")
	require.NoError(t, err)
	require.Len(t, fixed, 2)
	require.Equal(t, a, fixed[0].Seq)
	require.Equal(t, c, fixed[1].Seq)
	again, err := log.RepairOversized(ctx, "admin", "sweep")
	require.NoError(t, err)
	require.Empty(t, again)
}

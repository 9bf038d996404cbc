package pds

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/repo"
)

// bigRecords is how many records of bigRecordText bytes the bounded-read
// test writes: together a hundred megabytes, which one unbounded page or
// block list would hold in memory at once.
const (
	bigRecords    = 100
	bigRecordText = 990_000
	bigCollection = "com.example.big"
)

// writeBigRecords writes n records of about bigRecordText bytes each, one
// commit apiece (two would pass the commit's CAR limit), and returns
// their CIDs in rkey order.
func writeBigRecords(t *testing.T, b *syncBundle, did syntax.DID, n int) []cid.Cid {
	t.Helper()
	var out []cid.Cid
	for i := range n {
		res, err := b.engine.Apply(context.Background(), did, []repo.Write{{
			Action: repo.ActionCreate, Collection: bigCollection, RKey: syntax.RecordKey(fmt.Sprintf("3kbig%07d", i)),
			Record: map[string]any{"$type": bigCollection, "text": fmt.Sprintf("%07d", i) + strings.Repeat(string(rune('a'+i%26)), bigRecordText-7)},
		}}, nil)
		require.NoError(t, err)
		out = append(out, res.Results[0].CID)
	}
	return out
}

// TestBigRecordReadsBounded: reads that return many records or blocks hold
// a bounded amount whatever the records' sizes. listRecords pages end at
// --list-max-bytes with a cursor that walks every record, and reserve from
// the in-flight budget (six at once wait or are refused as the budget
// says); sync.getRecord reserves by the record's size; getBlocks streams.
//
// Not parallel: its getBlocks part measures the process's heap.
func TestBigRecordReadsBounded(t *testing.T) {
	const capacity = 32 << 20
	bud := budget.New(budget.Config{Capacity: capacity, MaxQueue: 2})
	b := syncSetup(t, syncOptions{budget: bud})
	did := b.newAccount(t, "bigrecords", "active")
	cids := writeBigRecords(t, b, did, bigRecords)

	t.Run("listRecords pages end at the byte bound", func(t *testing.T) { walkBigRecords(t, b, bud, did) })

	t.Run("six pages at once are under the budget", func(t *testing.T) {
		before := bud.Stats()
		hold, err := bud.Acquire(context.Background(), capacity)
		require.NoError(t, err)
		defer hold.Release()
		q := url.Values{"repo": {did.String()}, "collection": {bigCollection}, "limit": {"100"}}
		statuses := make(chan int, 6)
		for range 6 {
			go func() {
				statuses <- fetch(http.MethodGet, b.url+"/xrpc/com.atproto.repo.listRecords?"+q.Encode()).status
			}()
		}
		// Two wait for the budget (its queue's length), four are refused.
		require.Eventually(t, func() bool {
			st := bud.Stats()
			return st.QueueLen == 2 && st.Rejected == before.Rejected+4
		}, 30*time.Second, time.Millisecond)
		hold.Release()
		got := map[int]int{}
		for range 6 {
			got[<-statuses]++
		}
		require.Equal(t, map[int]int{http.StatusOK: 2, http.StatusServiceUnavailable: 4}, got)
		require.Eventually(t, func() bool { return bud.Stats().InUse == 0 }, 10*time.Second, time.Millisecond)
	})

	t.Run("sync.getRecord reserves by the record's size", func(t *testing.T) {
		b.writePosts(t, did, "3ksmall", 1)
		hold, err := bud.Acquire(context.Background(), capacity-2<<20)
		require.NoError(t, err)
		defer hold.Release()
		proof := func(collection, rkey string) string {
			return b.url + "/xrpc/com.atproto.sync.getRecord?" + url.Values{"did": {did.String()}, "collection": {collection}, "rkey": {rkey}}.Encode()
		}
		// A small record's proof fits the 2 MiB left.
		require.Equal(t, http.StatusOK, fetch(http.MethodGet, proof("app.bsky.feed.post", "3ksmall000000")).status)
		// A big one's does not: it waits for the budget.
		done := make(chan fetched, 1)
		go func() { done <- fetch(http.MethodGet, proof(bigCollection, "3kbig0000000")) }()
		require.Eventually(t, func() bool { return bud.Stats().QueueLen == 1 }, 30*time.Second, time.Millisecond)
		hold.Release()
		got := <-done
		require.Equal(t, http.StatusOK, got.status)
		require.Greater(t, len(got.body), bigRecordText)
	})

	t.Run("getBlocks streams", func(t *testing.T) {
		q := url.Values{"did": {did.String()}}
		for _, c := range cids {
			q.Add("cids", c.String())
		}
		before := heapInUse()
		resp, err := http.Get(b.url + "/xrpc/com.atproto.sync.getBlocks?" + q.Encode())
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		// The answer has begun and the client reads nothing yet: what the
		// server holds now is what it holds for the whole answer.
		during := heapInUse()
		growth := int64(during) - int64(before)
		t.Logf("live heap %d → %d bytes (%+d) with a %d-byte answer under way", before, during, growth, resp.ContentLength)
		require.Less(t, growth, int64(24<<20), "getBlocks of %d large records held %d bytes", len(cids), growth)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.EqualValues(t, resp.ContentLength, len(body))
		// Every block, each matching its CID.
		blocks := readCARBlocks(t, body)
		require.Equal(t, len(cids), len(blocks))
		for _, c := range cids {
			require.Greater(t, len(blocks[c.String()]), bigRecordText)
		}
		require.Eventually(t, func() bool { return bud.Stats().InUse == 0 }, 10*time.Second, time.Millisecond)
	})
}

// TestGetBlocksMissingBeforeAnything: a getBlocks naming a block the
// repository does not hold is BlockNotFound, answered before any block is
// sent.
func TestGetBlocksMissingBeforeAnything(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "missingblocks", "active")
	res := b.writePosts(t, did, "3kpost", 3)
	absent, err := cid.Decode("bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm")
	require.NoError(t, err)
	q := url.Values{"did": {did.String()}, "cids": {res.Commit.String(), absent.String()}}
	resp, body := b.get(t, "com.atproto.sync.getBlocks", q)
	requireXRPC(t, resp, body, http.StatusBadRequest, "BlockNotFound")
	require.Contains(t, string(body), absent.String())
}

// walkBigRecords walks did's big records with listRecords, both ways,
// checking that every page stays within the byte bound.
func walkBigRecords(t *testing.T, b *syncBundle, bud *budget.Budget, did syntax.DID) {
	t.Helper()
	for _, reverse := range []bool{false, true} {
		var seen []string
		cursor := ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, bigRecords, "the cursor does not move on")
			q := url.Values{"repo": {did.String()}, "collection": {bigCollection}, "limit": {"100"}, "reverse": {strconv.FormatBool(reverse)}}
			if cursor != "" {
				q.Set("cursor", cursor)
			}
			resp, body := b.get(t, "com.atproto.repo.listRecords", q)
			require.Equal(t, http.StatusOK, resp.StatusCode, "body: %.300s", body)
			require.LessOrEqual(t, len(body), config.DefaultListMaxBytes, "a page of %d bytes", len(body))
			var out listRecordsOutput
			require.NoError(t, json.Unmarshal(body, &out))
			require.NotEmpty(t, out.Records)
			for _, r := range out.Records {
				seen = append(seen, r.URI)
			}
			if out.Cursor == "" {
				break
			}
			cursor = out.Cursor
		}
		require.Len(t, seen, bigRecords, "reverse=%v", reverse)
		for i := 1; i < len(seen); i++ {
			// Newest (highest rkey) first, unless reverse.
			require.Equal(t, reverse, seen[i-1] < seen[i], "reverse=%v: order at %d", reverse, i)
		}
	}
	require.Zero(t, bud.Stats().InUse)
}

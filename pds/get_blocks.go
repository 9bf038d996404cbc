package pds

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/ipld/go-car"
	"github.com/ipld/go-car/util"

	"github.com/bulwark-pds/bulwark/repo"
)

// handleGetBlocks answers com.atproto.sync.getBlocks: the requested blocks
// of the repository's current state (commit, MST nodes, records) as a CAR
// without roots. The blocks are sized first (no block is read), so that a
// missing one is BlockNotFound before anything is sent and the answer has
// a Content-Length; then they are streamed one at a time, so the heap it
// holds is one block, not the thousand a request may name.
func (s *Server) handleGetBlocks(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	raw := p.list("cids")
	if err := p.Err(); err != nil {
		return err
	}
	if len(raw) == 0 {
		return InvalidRequest("missing required parameter \"cids\"")
	}
	if len(raw) > MaxGetBlocks {
		return InvalidRequest("%d cids asked for; the limit is %d per request", len(raw), MaxGetBlocks)
	}
	cids := make([]cid.Cid, 0, len(raw))
	seen := map[cid.Cid]bool{}
	for _, c := range raw {
		parsed, err := cid.Decode(c)
		if err != nil {
			return InvalidRequest("%q is not a CID: %v", clip(c, maxQuoted), err)
		}
		if !seen[parsed] {
			seen[parsed] = true
			cids = append(cids, parsed)
		}
	}
	// An estimate first, so that a refusal costs no database work.
	res, err := s.reserve(r.Context(), int64(len(cids))*blockReserve)
	if err != nil {
		return err
	}
	defer func() { res.Release() }()
	st, err := s.availableRepoFor(r, did)
	if err != nil {
		return err
	}
	sizes, err := s.repo.BlockSizes(r.Context(), did, cids)
	if err != nil {
		return err
	}
	sizes[st.head.Commit] = len(st.head.CommitBytes)
	var missing []string
	largest := 0
	var header carBuffer
	if err := car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{}, Version: 1}, &header); err != nil {
		return err
	}
	length := int64(len(header))
	for _, c := range cids {
		n, ok := sizes[c]
		if !ok {
			missing = append(missing, c.String())
			continue
		}
		largest = max(largest, n)
		length += ldSize(len(c.Bytes()) + n)
	}
	if len(missing) > 0 {
		return BlockNotFound("could not find cids: %v", missing)
	}
	if res, err = s.reserveMore(r.Context(), res, int64(streamBuffer)+int64(largest)*blockFactor); err != nil {
		return err
	}

	w.Header().Set("Content-Type", carContentType)
	w.Header().Set("Content-Length", strconv.FormatInt(length, 10))
	sw := newStreamWriter(w)
	bw := bufio.NewWriterSize(sw, streamBuffer)
	err = s.writeBlocks(r, bw, header, did, cids, sizes, st.head)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return s.endStream(r, sw, err)
	}
	return nil
}

// writeBlocks writes the CAR: header, then each block, read one at a
// time. A block that is gone or changed size since it was sized (a commit
// in between) fails the stream.
func (s *Server) writeBlocks(r *http.Request, bw *bufio.Writer, header []byte, did syntax.DID, cids []cid.Cid, sizes map[cid.Cid]int, head *repo.Head) error {
	if _, err := bw.Write(header); err != nil {
		return err
	}
	for _, c := range cids {
		data := head.CommitBytes
		if !c.Equals(head.Commit) {
			var err error
			data, err = s.repo.GetBlock(r.Context(), did, c)
			if errors.Is(err, repo.ErrRecordNotFound) {
				return fmt.Errorf("block %s went away while the answer was being sent: %w", c, err)
			}
			if err != nil {
				return err
			}
		}
		if len(data) != sizes[c] {
			return fmt.Errorf("block %s changed size while the answer was being sent", c)
		}
		if err := util.LdWrite(bw, c.Bytes(), data); err != nil {
			return err
		}
	}
	return nil
}

// ldSize is the bytes util.LdWrite writes for a section of n bytes: a
// uvarint length, then the section.
func ldSize(n int) int64 {
	return int64(binary.PutUvarint(make([]byte, binary.MaxVarintLen64), uint64(n)) + n)
}

package repo

import (
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/eventlog"
)

// commitParams is everything one commit stores, as the parameters of the
// SQL function bulwark_commit (migrations/00010), which stores it in one
// statement. Each field names the parameter it becomes.
type commitParams struct {
	did string // p_did
	// oldCommit is the commit the repo's root must still be at (p_old):
	// if another writer moved it, the call raises SQLSTATE BW001
	// (db.ErrRootMoved) before it writes anything.
	oldCommit []byte
	// commit, commitBlock, data and rev are the new root: the commit's CID
	// (p_commit), its signed block (p_commit_data), the MST root
	// (p_data) and the rev (p_rev).
	commit, commitBlock, data []byte
	rev                       string
	// removedNodes are the CIDs of MST nodes the new tree dropped
	// (p_rm_nodes); nodeCIDs and nodeData the nodes it adds (p_node_cids,
	// p_node_data).
	removedNodes       [][]byte
	nodeCIDs, nodeData [][]byte
	// delCollections and delRKeys name the records deleted (p_del_cols,
	// p_del_rkeys); the up* fields the records created or replaced
	// (p_up_cols, p_up_rkeys, p_up_cids, p_up_data).
	delCollections, delRKeys []string
	upCollections, upRKeys   []string
	upCIDs, upData           [][]byte
	// event is the #commit event (p_ev_kind, p_ev_rev, p_ev_body,
	// p_ev_seq_offset, p_ev_blocks_len, p_ev_ops).
	event *eventlog.Encoded
	// freshNodes says nodeCIDs are known not to be stored (the plan was
	// made from the cached tree of the root the commit moves from), so they
	// are inserted without ON CONFLICT (p_fresh_nodes).
	freshNodes bool
	// oldRev is the rev of the cached tree the commit was built on
	// (p_old_rev of bulwark_try_commit).
	oldRev string
}

// addRecords fills in the records the commit deletes and upserts.
func (p *commitParams) addRecords(upserts, deletes []preparedWrite) {
	for _, w := range deletes {
		p.delCollections = append(p.delCollections, string(w.Collection))
		p.delRKeys = append(p.delRKeys, string(w.RKey))
	}
	for _, w := range upserts {
		p.upCollections = append(p.upCollections, string(w.Collection))
		p.upRKeys = append(p.upRKeys, string(w.RKey))
		p.upCIDs = append(p.upCIDs, w.cid.Bytes())
		p.upData = append(p.upData, w.block)
	}
}

// args returns the parameters in bulwark_commit's order (see qCommit).
func (p *commitParams) args() []any {
	return []any{
		p.did, p.oldCommit, p.commit, p.commitBlock, p.data, p.rev,
		p.removedNodes, p.nodeCIDs, p.nodeData,
		p.delCollections, p.delRKeys,
		p.upCollections, p.upRKeys, p.upCIDs, p.upData,
		string(p.event.Kind), p.event.RevArg(), p.event.Body, p.event.SeqOffset, p.event.BlocksLen, p.event.OpsCount,
		p.freshNodes,
	}
}

// size is about what storing the commit sends: the commit, the MST nodes,
// the records and the event.
func (p *commitParams) size() int {
	n := len(p.commitBlock) + len(p.event.Body)
	for _, d := range p.nodeData {
		n += len(d)
	}
	for _, d := range p.upData {
		n += len(d)
	}
	return n
}

// queue adds the commit's guard, if any, and then the one statement that
// stores it (bulwark_commit, which runs every write server-side) to b:
// for a commit under the repo's row lock, whose root cannot move.
func queue(b *pgx.Batch, guard *Guard, p *commitParams) {
	if guard != nil {
		b.Queue(guard.SQL, guard.Args...)
	}
	b.Queue(qCommit, p.args()...)
}

// queueTry is queue for a commit built on a cached tree, whose root
// another process may have moved: bulwark_try_commit then stores nothing
// and answers what the cache lacks, which is scanned into moved (left nil
// when the commit was stored). The other commits of a group go on.
func queueTry(b *pgx.Batch, guard *Guard, p *commitParams, moved *[][]byte) {
	if guard != nil {
		b.Queue(guard.SQL, guard.Args...)
	}
	b.Queue(qTryCommit, append(p.args(), p.oldRev)...).QueryRow(func(row pgx.Row) error {
		return row.Scan(moved)
	})
}

package populate

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/plc"
)

// Shares of accounts with each kind of side row: app passwords, stored
// preferences, OAuth grants, a confirmed email, a mail in the outbox, a
// live emailed code.
const (
	appPasswordShare = 0.10
	preferenceShare  = 0.60
	oauthShare       = 0.15
	confirmedShare   = 0.70
	outboxShare      = 0.05
	emailTokenShare  = 0.01
)

// rows are the rows of a batch of accounts, one slice per table, in the
// column order of tables.
type rows map[string][][]any

func (r rows) add(table string, row ...any) { r[table] = append(r[table], row) }

// builder makes accounts' rows.
type builder struct {
	cfg          *Config
	passwordHash string
	now          time.Time
}

// build makes account s's rows into out, and returns how many records it
// holds (profile included).
func (b *builder) build(ctx context.Context, s Shape, out rows) (int, error) {
	r := s.rng()
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		return 0, err
	}
	pub, err := key.PublicKey()
	if err != nil {
		return 0, err
	}
	handle, err := syntax.ParseHandle(b.cfg.Handle(s.Index))
	if err != nil {
		return 0, err
	}
	did, genesis, err := b.cfg.PLC.Genesis(plc.Identity{Handle: handle, SigningKey: pub, PDSEndpoint: b.cfg.PublicURL})
	if err != nil {
		return 0, err
	}
	sealed, err := b.cfg.Keys.Seal(did, key)
	if err != nil {
		return 0, err
	}
	created := b.now.Add(-time.Duration(r.Int64N(int64(accountSpan))))
	recs, err := accountRecords(s, r, created, b.now, b.cfg.Blobs)
	if err != nil {
		return 0, err
	}
	if err := b.addRepo(ctx, did, key, recs, out); err != nil {
		return 0, err
	}
	if err := b.addAccount(did, s.Index, handle.String(), sealed, genesis, created, r, out); err != nil {
		return 0, err
	}
	if err := b.addSide(did, s, created, r, out); err != nil {
		return 0, err
	}
	return len(recs), nil
}

// addRepo builds the repository of recs (its MST and signed commit) and
// adds its rows: root, nodes, records, blob references.
func (b *builder) addRepo(ctx context.Context, did syntax.DID, key atcrypto.PrivateKey, recs []*record, out rows) error {
	m := make(map[string]cid.Cid, len(recs))
	for _, rec := range recs {
		m[rec.path()] = rec.cid
	}
	tree, err := mst.LoadTreeFromMap(m)
	if err != nil {
		return fmt.Errorf("building the MST of %s: %w", did, err)
	}
	nodes := &collector{}
	root, err := tree.WriteDiffBlocks(ctx, nodes)
	if err != nil {
		return fmt.Errorf("encoding the MST of %s: %w", did, err)
	}
	rev := syntax.NewTIDFromTime(b.now, 0).String()
	commit := atrepo.Commit{DID: did.String(), Version: atrepo.ATPROTO_REPO_VERSION, Data: *root, Rev: rev}
	if err := commit.Sign(key); err != nil {
		return fmt.Errorf("signing the commit of %s: %w", did, err)
	}
	var buf bytes.Buffer
	if err := commit.MarshalCBOR(&buf); err != nil {
		return err
	}
	commitCID, err := cidBuilder.Sum(buf.Bytes())
	if err != nil {
		return err
	}
	d := did.String()
	out.add("repo_roots", d, commitCID.Bytes(), buf.Bytes(), root.Bytes(), rev, b.now, b.now)
	for _, n := range nodes.blocks {
		out.add("repo_nodes", d, n.Cid().Bytes(), rev, n.RawData())
	}
	seen := map[string]bool{}
	for _, rec := range recs {
		out.add("records", d, rec.collection, rec.rkey, rec.cid.Bytes(), rev, rec.block)
		if rec.blob == nil {
			continue
		}
		bc := rec.blob.CID.String()
		out.add("record_blobs", d, rec.path(), bc, rev)
		if !seen[bc] {
			seen[bc] = true
			out.add("blobs", d, bc, rec.blob.Mime, rec.blob.Size, bc, b.now)
		}
	}
	return nil
}

// addAccount adds the account's row and its DID's genesis operation in the
// development PLC directory.
func (b *builder) addAccount(did syntax.DID, index int, handle string, sealed []byte, genesis *didplc.RegularOp, created time.Time, r *mrand.Rand, out rows) error {
	d := did.String()
	var confirmed any
	if r.Float64() < confirmedShare {
		confirmed = created.Add(time.Duration(r.IntN(3600)) * time.Second)
	}
	out.add("accounts", d, handle, b.cfg.Email(index), b.passwordHash, sealed, "active", created, created, confirmed)
	op, err := json.Marshal(&didplc.OpEnum{Regular: genesis})
	if err != nil {
		return err
	}
	out.add("dev_plc_operations", d, 0, genesis.CID().String(), string(op), created.UTC().Truncate(time.Millisecond))
	return nil
}

// addSide adds what accounts keep besides their repository: sessions, app
// passwords, preferences, OAuth grants, mail.
func (b *builder) addSide(did syntax.DID, s Shape, created time.Time, r *mrand.Rand, out rows) error {
	d := did.String()
	expires := b.now.Add(account.RefreshTokenTTL)
	for range 1 + r.IntN(3) {
		out.add("refresh_tokens", randomID(), randomID(), d, nil, expires, b.now)
	}
	if r.Float64() < appPasswordShare {
		for k := range 1 + r.IntN(2) {
			// App passwords are random, so a random hash is the hash of
			// one nobody knows (and costs no argon2id).
			name := fmt.Sprintf("app %d", k+1)
			out.add("app_passwords", d, name, randomBytes(32), k == 1, created)
			out.add("refresh_tokens", randomID(), randomID(), d, name, expires, b.now)
		}
	}
	if r.Float64() < preferenceShare {
		for _, p := range preferences(r) {
			out.add("account_preferences", d, p.typ, p.value)
		}
	}
	if r.Float64() < oauthShare {
		device := randomBytes(32)
		out.add("oauth_devices", device, "Mozilla/5.0 (X11; Linux x86_64) Chrome/131.0", b.now, b.now, b.now.Add(365*24*time.Hour))
		out.add("oauth_device_accounts", device, d, b.now, b.now.Add(365*24*time.Hour))
		for range 1 + r.IntN(2) {
			out.add("oauth_grants", "grant-"+randomID(), d, "https://client.example/oauth-client-metadata.json",
				"atproto transition:generic", randomID(), `{"method":"none"}`, randomBytes(32), b.now.Add(30*24*time.Hour), b.now, b.now)
		}
	}
	email := b.cfg.Email(s.Index)
	if r.Float64() < outboxShare {
		out.add("email_outbox", "sent", "confirm_email", d, email, "confirm_email", nil, nil,
			`{}`, 1, b.now, "", b.now, b.now, b.now)
	}
	if r.Float64() < emailTokenShare {
		out.add("email_tokens", d, "confirm_email", randomBytes(32), b.now, b.now.Add(24*time.Hour))
	}
	return nil
}

type preference struct{ typ, value string }

// preferences are an app's usual settings.
func preferences(r *mrand.Rand) []preference {
	out := []preference{
		{"app.bsky.actor.defs#adultContentPref", `{"$type":"app.bsky.actor.defs#adultContentPref","enabled":false}`},
		{"app.bsky.actor.defs#savedFeedsPrefV2", `{"$type":"app.bsky.actor.defs#savedFeedsPrefV2","items":[{"id":"3l6ovcmm2vd2j","pinned":true,"type":"timeline","value":"following"}]}`},
	}
	for _, label := range []string{"nsfw", "gore", "nudity"}[:r.IntN(4)] {
		out = append(out, preference{"app.bsky.actor.defs#contentLabelPref",
			`{"$type":"app.bsky.actor.defs#contentLabelPref","label":"` + label + `","visibility":"warn"}`})
	}
	return out
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// randomID is a session or token id as package account makes them.
func randomID() string { return base64.RawURLEncoding.EncodeToString(randomBytes(24)) }

// collector receives the blocks mst.Tree.WriteDiffBlocks writes. It
// implements the part of go-ipfs-blockstore's Blockstore that
// WriteDiffBlocks calls.
type collector struct {
	blocks []blocks.Block
	seen   map[cid.Cid]bool
}

func (c *collector) Put(_ context.Context, b blocks.Block) error {
	if c.seen == nil {
		c.seen = map[cid.Cid]bool{}
	}
	if !c.seen[b.Cid()] {
		c.seen[b.Cid()] = true
		c.blocks = append(c.blocks, b)
	}
	return nil
}

func (c *collector) PutMany(ctx context.Context, bs []blocks.Block) error {
	for _, b := range bs {
		_ = c.Put(ctx, b)
	}
	return nil
}

func (c *collector) Has(_ context.Context, k cid.Cid) (bool, error) { return c.seen[k], nil }
func (c *collector) Get(context.Context, cid.Cid) (blocks.Block, error) {
	return nil, fmt.Errorf("populate: the MST collector only collects")
}
func (c *collector) GetSize(context.Context, cid.Cid) (int, error) {
	return 0, fmt.Errorf("populate: the MST collector only collects")
}
func (c *collector) DeleteBlock(context.Context, cid.Cid) error { return nil }
func (c *collector) AllKeysChan(context.Context) (<-chan cid.Cid, error) {
	return nil, fmt.Errorf("populate: the MST collector only collects")
}
func (c *collector) HashOnRead(bool) {}

package populate

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/api/bsky"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
)

// The size distribution. A realistic account holds a profile and a
// log-normal number of other records (median 20, σ 1.7: mean about 85, a
// tenth of accounts over 180, one in a thousand over 3,700), the tail
// reaching tens of thousands in a hundred thousand accounts; account 0 holds
// Config.Largest. A small account holds a profile and 3 to 20 records.
const (
	realisticMedian = 20
	realisticSigma  = 1.7
	// MaxRecords caps the distribution: the largest repository the
	// distribution itself makes (Config.Largest may ask for more).
	MaxRecords  = 100_000
	smallMin    = 3
	smallSpread = 18
	// accountSpan is how far back accounts were created.
	accountSpan = 2 * 365 * 24 * time.Hour
)

// Shape is what follows from an account's index alone, so that a resumed
// run cuts the same batches: its size and its randomness.
type Shape struct {
	Index int
	// Records is how many records besides the profile.
	Records int
	seed    uint64
}

// ShapeOf returns account i's shape under cfg.
func ShapeOf(cfg *Config, i int) Shape {
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
	s := Shape{Index: i, seed: rng.Uint64()}
	switch {
	case i == 0 && cfg.Largest > 0:
		s.Records = cfg.Largest
	case i < cfg.Realistic:
		n := math.Round(realisticMedian * math.Exp(realisticSigma*rng.NormFloat64()))
		s.Records = int(min(n, MaxRecords))
	default:
		s.Records = smallMin + rng.IntN(smallSpread)
	}
	return s
}

// rng returns the account's own random source (texts, times, subjects).
func (s Shape) rng() *rand.Rand {
	return rand.New(rand.NewPCG(s.seed, 0x62756c7761726b))
}

// Collections, with the share of an account's records in each.
var collections = []struct {
	nsid  string
	share float64
}{
	{"app.bsky.feed.like", 0.45},
	{"app.bsky.feed.post", 0.25},
	{"app.bsky.graph.follow", 0.20},
	{"app.bsky.feed.repost", 0.10},
}

const (
	profileNSID = "app.bsky.actor.profile"
	postNSID    = "app.bsky.feed.post"
	// Shares of profiles with an avatar, posts with an image, posts that
	// are replies.
	avatarShare = 0.6
	imageShare  = 0.15
	replyShare  = 0.3
)

func pickCollection(r *rand.Rand) string {
	x := r.Float64()
	for _, c := range collections {
		if x < c.share {
			return c.nsid
		}
		x -= c.share
	}
	return collections[0].nsid
}

// record is one record of an account, encoded.
type record struct {
	collection, rkey string
	block            []byte
	cid              cid.Cid
	blob             *Blob // the blob it references, if any
}

func (r *record) path() string { return r.collection + "/" + r.rkey }

var cidBuilder = cid.NewPrefixV1(cid.DagCBOR, multihash.SHA2_256)

// encode encodes one of indigo's generated lexicon types as a record.
func encode(collection, rkey string, v interface{ MarshalCBOR(w io.Writer) error }) (*record, error) {
	var buf bytes.Buffer
	if err := v.MarshalCBOR(&buf); err != nil {
		return nil, fmt.Errorf("encoding %s/%s: %w", collection, rkey, err)
	}
	c, err := cidBuilder.Sum(buf.Bytes())
	if err != nil {
		return nil, err
	}
	return &record{collection: collection, rkey: rkey, block: buf.Bytes(), cid: c}, nil
}

// words make post texts and profile descriptions.
var words = strings.Fields(`the a of to and in is it you that he was for on are with as I his they be at one have
this from or had by hot word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make thing see him two has
look more day could go come did number sound no most people my over know water than call first who may down side
been now find any new work part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line differ turn cause much mean
before move right boy old too same tell does set three want air well also play small end put home read hand port large
spell add even land here must big high such follow act why ask men change went light kind off need house picture try
us again animal point mother world near build self earth father bluesky atproto relay feed post repo`)

func text(r *rand.Rand, minLen, maxLen int) string {
	want := minLen + r.IntN(maxLen-minLen+1)
	var b strings.Builder
	for b.Len() < want {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// otherDID is a well-formed did:plc of someone else (a like's or follow's
// subject): 24 base32 characters, as PLC makes them.
func otherDID(r *rand.Rand) string {
	var b [15]byte
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return "did:plc:" + b32.EncodeToString(b[:])
}

// strongRef names a record of someone else, with a CID it could have.
func strongRef(r *rand.Rand, collection string, at time.Time) *comatproto.RepoStrongRef {
	var seed [8]byte
	for i := range seed {
		seed[i] = byte(r.Uint32())
	}
	sum := sha256.Sum256(seed[:])
	mh, _ := multihash.Encode(sum[:], multihash.SHA2_256)
	c := cid.NewCidV1(cid.DagCBOR, mh)
	tid := syntax.NewTIDFromTime(at.Add(-time.Duration(r.IntN(48*3600))*time.Second), uint(r.IntN(1024)))
	return &comatproto.RepoStrongRef{Uri: "at://" + otherDID(r) + "/" + collection + "/" + tid.String(), Cid: c.String()}
}

func lexBlob(b *Blob) *lexutil.LexBlob {
	return &lexutil.LexBlob{Ref: lexutil.LexLink(b.CID), MimeType: b.Mime, Size: b.Size}
}

// makeRecord builds one record of collection, created at at.
func makeRecord(r *rand.Rand, collection, rkey string, at time.Time, blobs []Blob) (*record, error) {
	created := at.UTC().Format(time.RFC3339Nano)
	var rec *record
	var err error
	var blob *Blob
	switch collection {
	case "app.bsky.feed.like":
		rec, err = encode(collection, rkey, &bsky.FeedLike{CreatedAt: created, Subject: strongRef(r, postNSID, at)})
	case "app.bsky.feed.repost":
		rec, err = encode(collection, rkey, &bsky.FeedRepost{CreatedAt: created, Subject: strongRef(r, postNSID, at)})
	case "app.bsky.graph.follow":
		rec, err = encode(collection, rkey, &bsky.GraphFollow{CreatedAt: created, Subject: otherDID(r)})
	case postNSID:
		p := &bsky.FeedPost{CreatedAt: created, Text: text(r, 10, 280), Langs: []string{"en"}}
		if r.Float64() < replyShare {
			root := strongRef(r, postNSID, at)
			p.Reply = &bsky.FeedPost_ReplyRef{Root: root, Parent: strongRef(r, postNSID, at)}
		}
		if len(blobs) > 0 && r.Float64() < imageShare {
			b := &blobs[r.IntN(len(blobs))]
			blob = b
			p.Embed = &bsky.FeedPost_Embed{EmbedImages: &bsky.EmbedImages{Images: []*bsky.EmbedImages_Image{{
				Alt: text(r, 5, 60), Image: lexBlob(b),
				AspectRatio: &bsky.EmbedDefs_AspectRatio{Width: 1000, Height: 750},
			}}}}
		}
		rec, err = encode(collection, rkey, p)
	default:
		return nil, fmt.Errorf("populate: no generator for %s", collection)
	}
	if err != nil {
		return nil, err
	}
	rec.blob = blob
	return rec, nil
}

// makeProfile builds the account's profile record.
func makeProfile(r *rand.Rand, created time.Time, blobs []Blob) (*record, error) {
	name := text(r, 4, 24)
	desc := text(r, 20, 200)
	at := created.UTC().Format(time.RFC3339Nano)
	p := &bsky.ActorProfile{DisplayName: &name, Description: &desc, CreatedAt: &at}
	var blob *Blob
	if len(blobs) > 0 && r.Float64() < avatarShare {
		blob = &blobs[r.IntN(len(blobs))]
		p.Avatar = lexBlob(blob)
	}
	rec, err := encode(profileNSID, "self", p)
	if err != nil {
		return nil, err
	}
	rec.blob = blob
	return rec, nil
}

// accountRecords builds the account's records: the profile and
// s.Records others, created between created and now in rkey (TID) order.
func accountRecords(s Shape, r *rand.Rand, created, now time.Time, blobs []Blob) ([]*record, error) {
	profile, err := makeProfile(r, created, blobs)
	if err != nil {
		return nil, err
	}
	out := make([]*record, 0, s.Records+1)
	out = append(out, profile)
	clock := uint(r.IntN(1024))
	span := now.Sub(created)
	// Evenly spaced creation times with jitter, in order: TIDs rise with
	// them, so no two collide.
	step := span / time.Duration(s.Records+1)
	for k := 0; k < s.Records; k++ {
		at := created.Add(step*time.Duration(k+1) + time.Duration(r.Int64N(int64(max(step/2, time.Microsecond)))))
		rkey := syntax.NewTID(at.UnixMicro()+int64(k), clock).String()
		rec, err := makeRecord(r, pickCollection(r), rkey, at, blobs)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

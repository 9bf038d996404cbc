package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/identity"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// verifier checks #commit events: the diff against prevData and the
// records (indigo's VerifyCommitMessage) and the signature against the key
// the account's DID document (in the cluster's development PLC) publishes.
// Each commit is checked once.
type verifier struct {
	dir  identity.Directory
	mu   sync.Mutex
	keys map[string]atcrypto.PublicKey
	done map[string]error // did + " " + rev
}

func newVerifier(plcURL string) *verifier {
	return &verifier{dir: &identity.BaseDirectory{PLCURL: plcURL, SkipHandleVerification: true}, keys: map[string]atcrypto.PublicKey{}, done: map[string]error{}}
}

func (v *verifier) verify(c *comatproto.SyncSubscribeRepos_Commit) error {
	id := c.Repo + " " + c.Rev
	v.mu.Lock()
	err, ok := v.done[id]
	v.mu.Unlock()
	if ok {
		return err
	}
	err = v.check(c)
	v.mu.Lock()
	v.done[id] = err
	v.mu.Unlock()
	return err
}

func (v *verifier) check(c *comatproto.SyncSubscribeRepos_Commit) error {
	ctx := context.Background()
	if _, err := atrepo.VerifyCommitMessage(ctx, c); err != nil {
		return err
	}
	commit, _, err := atrepo.LoadCommitFromCAR(ctx, bytes.NewReader(c.Blocks))
	if err != nil {
		return err
	}
	v.mu.Lock()
	key, ok := v.keys[c.Repo]
	v.mu.Unlock()
	if !ok {
		ident, err := v.dir.LookupDID(ctx, syntax.DID(c.Repo))
		if err != nil {
			return fmt.Errorf("resolving %s: %w", c.Repo, err)
		}
		if key, err = ident.PublicKey(); err != nil {
			return err
		}
		v.mu.Lock()
		v.keys[c.Repo] = key
		v.mu.Unlock()
	}
	return commit.VerifySignature(key)
}

// checkAcked requires every acknowledged write to be in its repository as
// every node serves it (getRepo, byte-identical from each node) and in a
// #commit of the first stream. It returns how many were missing.
func checkAcked(ctx context.Context, nodes []*client, s *stream, acks []ack) (lost int, problems []string) {
	byDID := map[string][]ack{}
	for _, a := range acks {
		byDID[a.did] = append(byDID[a.did], a)
	}
	inStream := map[string]bool{}
	s.mu.Lock()
	for _, f := range s.frames {
		if f.commit == nil {
			continue
		}
		for _, op := range f.commit.Ops {
			if op.Cid != nil {
				inStream[f.did+" "+op.Path+" "+op.Cid.String()] = true
			}
		}
	}
	s.mu.Unlock()
	for did, as := range byDID {
		car, err := sameRepo(ctx, nodes, did)
		if err != nil {
			problems = append(problems, err.Error())
		}
		var repo *atrepo.Repo
		if car != nil {
			if _, repo, err = atrepo.LoadRepoFromCAR(ctx, bytes.NewReader(car)); err != nil {
				problems = append(problems, fmt.Sprintf("getRepo %s: %v", did, err))
			}
		}
		if repo == nil {
			lost += len(as)
			continue
		}
		for _, a := range as {
			coll, rkey, err := syntax.ParseRepoPath(a.path)
			if err != nil {
				problems = append(problems, fmt.Sprintf("acked path %q: %v", a.path, err))
				continue
			}
			_, got, err := repo.GetRecordBytes(ctx, coll, rkey)
			if err != nil || got == nil || got.String() != a.cid {
				lost++
				continue
			}
			if !inStream[a.did+" "+a.path+" "+a.cid] {
				problems = append(problems, fmt.Sprintf("acked write %s %s is on no #commit of %s's firehose", a.did, a.path, s.node.name))
			}
		}
	}
	return lost, problems
}

// sameRepo fetches did's repository from every node and requires the
// same bytes from each; a write the test stopped waiting for may still
// land on the server in between, so a difference is looked at again after
// a moment before it counts.
func sameRepo(ctx context.Context, nodes []*client, did string) ([]byte, error) {
	var err error
	for try := range 5 {
		if try > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		var first []byte
		err = nil
		for _, n := range nodes {
			var car []byte
			if cerr := n.call(ctx, http.MethodGet, "com.atproto.sync.getRepo", "", url.Values{"did": {did}}, nil, &car); cerr != nil {
				err = fmt.Errorf("getRepo %s from %s: %w", did, n.base, cerr)
				break
			}
			if first == nil {
				first = car
			} else if !bytes.Equal(first, car) {
				err = fmt.Errorf("getRepo %s differs between %s and %s", did, nodes[0].base, n.base)
				break
			}
		}
		if err == nil {
			return first, nil
		}
	}
	return nil, err
}

// checkBlobsAndSessions uploads a blob through the balancer and reads it
// back from every node, and uses a session made on one node on the others.
func checkBlobsAndSessions(ctx context.Context, lb *client, nodes []*client, a *account) error {
	data := make([]byte, 300<<10)
	_, _ = rand.Read(data)
	var up struct {
		Blob map[string]any `json:"blob"`
	}
	if err := lb.call(ctx, http.MethodPost, "com.atproto.repo.uploadBlob", a.token, nil, data, &up); err != nil {
		return fmt.Errorf("uploadBlob: %w", err)
	}
	ref, _ := up.Blob["ref"].(map[string]any)
	cid, _ := ref["$link"].(string)
	rec := map[string]any{"$type": "com.example.file", "file": up.Blob}
	if err := lb.call(ctx, http.MethodPost, "com.atproto.repo.createRecord", a.token, nil,
		map[string]any{"repo": a.did, "collection": "com.example.file", "record": rec}, nil); err != nil {
		return fmt.Errorf("a post with the blob: %w", err)
	}
	for _, n := range nodes {
		var got []byte
		if err := n.call(ctx, http.MethodGet, "com.atproto.sync.getBlob", "", url.Values{"did": {a.did}, "cid": {cid}}, nil, &got); err != nil {
			return fmt.Errorf("getBlob from %s: %w", n.base, err)
		}
		if !bytes.Equal(got, data) {
			return fmt.Errorf("getBlob from %s: other bytes", n.base)
		}
	}
	var sess struct {
		AccessJwt string `json:"accessJwt"`
	}
	if err := nodes[0].call(ctx, http.MethodPost, "com.atproto.server.createSession", "", nil,
		map[string]string{"identifier": a.handle, "password": a.password}, &sess); err != nil {
		return fmt.Errorf("createSession on %s: %w", nodes[0].base, err)
	}
	for _, n := range nodes[1:] {
		var out struct {
			DID string `json:"did"`
		}
		if err := n.call(ctx, http.MethodGet, "com.atproto.server.getSession", sess.AccessJwt, nil, nil, &out); err != nil || out.DID != a.did {
			return fmt.Errorf("a session made on %s used on %s: %v", nodes[0].base, n.base, err)
		}
	}
	return nil
}

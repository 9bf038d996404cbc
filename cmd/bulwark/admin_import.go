package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
)

// Files of an account export directory.
const (
	exportCARFile      = "repo.car"
	exportBlobsDir     = "blobs"
	exportManifestFile = "export.json"
	exportPrefsFile    = "preferences.json"
)

// blobsPage is how many blob CIDs one listBlobs call asks for.
const blobsPage = 1000

// runAccountImport is `bulwark admin account import [--reason TEXT]
// ACCOUNT CAR`: it replaces the account's repository with the CAR
// (io.github.bulwark-pds.admin.importRepo) and prints what was imported.
func runAccountImport(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	reason := fs.String("reason", "", "why (recorded in the audit log)")
	c, did, pos, err := a.parseAccount(ctx, cmd, fs, args, 2)
	if err != nil {
		return err
	}
	f, err := os.Open(pos[1])
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	q := url.Values{"did": {did.String()}}
	if *reason != "" {
		q.Set("reason", *reason)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/xrpc/"+AdminNSIDPrefix+"importRepo?"+q.Encode(), f)
	if err != nil {
		return err
	}
	req.ContentLength = st.Size()
	req.Header.Set("Content-Type", "application/vnd.ipld.car")
	resp, err := c.stream(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminResponse))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return c.xrpcError(AdminNSIDPrefix+"importRepo", resp.StatusCode, data, true)
	}
	var summary map[string]any
	if err := json.Unmarshal(data, &summary); err != nil {
		return err
	}
	return a.output(summary, func(w io.Writer) error { return printJSON(w, data) })
}

// runAccountExport is `bulwark admin account export ACCOUNT DIR`.
func runAccountExport(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	c, did, pos, err := a.parseAccount(ctx, cmd, fs, args, 2)
	if err != nil {
		return err
	}
	m, err := c.exportAccount(ctx, did, pos[1])
	if err != nil {
		return err
	}
	return a.output(m, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "exported %s (rev %s), %d blobs and %d preferences to %s\n", m.DID, m.Rev, m.Blobs, m.Preferences, pos[1])
		return err
	})
}

// stream sends req with the admin credentials and no overall timeout: an
// import or export of a large repository takes as long as it takes (the
// server drops a connection that stalls). The caller closes the body.
func (c *adminClient) stream(req *http.Request) (*http.Response, error) {
	pw, err := c.run.adminPassword()
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth("admin", pw)
	h := *c.http
	h.Timeout = 0
	resp, err := h.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the server at %s: %w", c.base, err)
	}
	return resp, nil
}

// exportManifest describes an export directory.
type exportManifest struct {
	DID        string `json:"did"`
	Rev        string `json:"rev"`
	Commit     string `json:"commit"`
	ExportedAt string `json:"exportedAt"`
	Repo       string `json:"repo"`
	Blobs      int    `json:"blobs"`
	// Preferences is how many preferences were written to
	// preferences.json.
	Preferences int `json:"preferences"`
}

// exportAccount writes the account's repository (sync.getRepo) to
// dir/repo.car, every blob its records use (sync.listBlobs, sync.getBlob)
// to dir/blobs/<cid>, each checked against its CID, its preferences
// (io.github.bulwark-pds.admin.getPreferences) to dir/preferences.json,
// and a manifest. Files
// are written under a temporary name and renamed once complete.
func (c *adminClient) exportAccount(ctx context.Context, did syntax.DID, dir string) (*exportManifest, error) {
	if err := os.MkdirAll(filepath.Join(dir, exportBlobsDir), 0o700); err != nil {
		return nil, err
	}
	carPath := filepath.Join(dir, exportCARFile)
	if err := c.download(ctx, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}}, carPath, cid.Undef); err != nil {
		return nil, fmt.Errorf("exporting the repository: %w", err)
	}
	commit, commitCID, err := readCommit(ctx, carPath)
	if err != nil {
		return nil, err
	}
	n := 0
	cursor := ""
	for {
		q := url.Values{"did": {did.String()}, "limit": {fmt.Sprint(blobsPage)}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Cursor string   `json:"cursor"`
			CIDs   []string `json:"cids"`
		}
		if err := c.xrpc(ctx, http.MethodGet, "com.atproto.sync.listBlobs", q, nil, &page, true); err != nil {
			return nil, fmt.Errorf("listing blobs: %w", err)
		}
		for _, raw := range page.CIDs {
			bc, err := cid.Decode(raw)
			if err != nil {
				return nil, fmt.Errorf("listBlobs answered %q, not a CID", raw)
			}
			q := url.Values{"did": {did.String()}, "cid": {bc.String()}}
			if err := c.download(ctx, "com.atproto.sync.getBlob", q, filepath.Join(dir, exportBlobsDir, bc.String()), bc); err != nil {
				return nil, fmt.Errorf("exporting blob %s: %w", bc, err)
			}
			n++
		}
		if page.Cursor == "" || len(page.CIDs) == 0 {
			break
		}
		cursor = page.Cursor
	}
	var prefs struct {
		Preferences []json.RawMessage `json:"preferences"`
	}
	if err := c.call(ctx, http.MethodGet, "getPreferences", url.Values{"did": {did.String()}}, nil, &prefs); err != nil {
		return nil, fmt.Errorf("exporting preferences: %w", err)
	}
	pb, err := json.MarshalIndent(map[string]any{"preferences": prefs.Preferences}, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, exportPrefsFile), append(pb, '\n'), 0o600); err != nil {
		return nil, err
	}
	m := exportManifest{
		DID: did.String(), Rev: commit.Rev, Commit: commitCID.String(), ExportedAt: time.Now().UTC().Format(time.RFC3339),
		Repo: exportCARFile, Blobs: n, Preferences: len(prefs.Preferences),
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, exportManifestFile), append(b, '\n'), 0o600); err != nil {
		return nil, err
	}
	return &m, nil
}

// download streams a GET answer into path. With want defined, the bytes
// must hash to that blob CID.
func (c *adminClient) download(ctx context.Context, nsid string, q url.Values, path string, want cid.Cid) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/xrpc/"+nsid+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := c.stream(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxAdminResponse))
		return c.xrpcError(nsid, resp.StatusCode, data, true)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".part-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), resp.Body); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if want.Defined() {
		got, err := blobCID(h.Sum(nil))
		if err != nil {
			return err
		}
		if !got.Equals(want) {
			return fmt.Errorf("the bytes served hash to %s", got)
		}
	}
	return os.Rename(tmp.Name(), path)
}

// readCommit reads the commit of an exported repository.
func readCommit(ctx context.Context, path string) (*atrepo.Commit, cid.Cid, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, cid.Undef, err
	}
	defer f.Close()
	commit, c, err := atrepo.LoadCommitFromCAR(ctx, f)
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("the exported repository does not load: %w", err)
	}
	if c == nil {
		return nil, cid.Undef, errors.New("the exported repository has no commit")
	}
	return commit, *c, nil
}

// blobCID is the CID of a blob whose SHA-256 is sum, as the server
// computes it (raw codec, CIDv1).
func blobCID(sum []byte) (cid.Cid, error) {
	mh, err := multihash.Encode(sum, multihash.SHA2_256)
	if err != nil {
		return cid.Undef, err
	}
	return cid.NewCidV1(cid.Raw, mh), nil
}

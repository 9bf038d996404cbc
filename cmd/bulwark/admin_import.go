package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
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
)

// blobsPage is how many blob CIDs one listBlobs call asks for.
const blobsPage = 1000

// accountCommand runs `bulwark admin account import|export`.
func (c *adminClient) accountCommand(ctx context.Context, args []string, out io.Writer) error {
	if len(args) < 1 {
		return usageError("account needs a subcommand")
	}
	fs := flag.NewFlagSet("account "+args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	reason := fs.String("reason", "", "why (recorded in the audit log)")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError(err.Error())
	}
	rest := fs.Args()
	switch args[0] {
	case "import":
		if len(rest) != 2 {
			return usageError("account import needs <did|handle> <car file>")
		}
		return c.importAccount(ctx, rest[0], rest[1], *reason, out)
	case "export":
		if len(rest) != 2 {
			return usageError("account export needs <did|handle> <directory>")
		}
		return c.exportAccount(ctx, rest[0], rest[1], out)
	}
	return usageError(fmt.Sprintf("unknown account command %q", args[0]))
}

// streamClient is the admin client without its overall timeout: an
// import or export of a large repository takes as long as it takes (the
// server drops a connection that stalls).
func (c *adminClient) streamClient() *http.Client {
	h := *c.http
	h.Timeout = 0
	return &h
}

// resolveAccount turns a DID or a handle hosted on the server into a DID.
func (c *adminClient) resolveAccount(ctx context.Context, id string) (syntax.DID, error) {
	if strings.HasPrefix(id, "did:") {
		return syntax.ParseDID(id)
	}
	h, err := syntax.ParseHandle(id)
	if err != nil {
		return "", usageError(fmt.Sprintf("%q is neither a DID nor a handle", id))
	}
	var res struct {
		DID string `json:"did"`
	}
	if err := c.xrpc(ctx, "com.atproto.identity.resolveHandle", url.Values{"handle": {h.String()}}, &res); err != nil {
		return "", fmt.Errorf("resolving %s: %w", h, err)
	}
	return syntax.ParseDID(res.DID)
}

// importAccount replaces the account's repository with the CAR in file
// (io.github.bulwark-pds.admin.importRepo) and prints what was imported.
func (c *adminClient) importAccount(ctx context.Context, id, file, reason string, out io.Writer) error {
	did, err := c.resolveAccount(ctx, id)
	if err != nil {
		return err
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	q := url.Values{"did": {did.String()}}
	if reason != "" {
		q.Set("reason", reason)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/xrpc/"+AdminNSIDPrefix+"importRepo?"+q.Encode(), f)
	if err != nil {
		return err
	}
	req.ContentLength = st.Size()
	req.Header.Set("Content-Type", "application/vnd.ipld.car")
	req.SetBasicAuth("admin", c.password)
	resp, err := c.streamClient().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := readAnswer(resp)
	if err != nil {
		return err
	}
	return printJSON(out, data)
}

// readAnswer reads a JSON answer, or turns an XRPC error into an error.
func readAnswer(resp *http.Response) (json.RawMessage, error) {
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		var xe struct{ Error, Message string }
		if json.Unmarshal(data, &xe) == nil && xe.Error != "" {
			return nil, fmt.Errorf("%s: %s (HTTP %d)", xe.Error, xe.Message, resp.StatusCode)
		}
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return data, nil
}

// xrpc calls a query outside the admin namespace with admin credentials
// and decodes its JSON answer into res.
func (c *adminClient) xrpc(ctx context.Context, nsid string, q url.Values, res any) error {
	resp, err := c.get(ctx, nsid, q)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := readAnswer(resp)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, res)
}

// get starts a GET of an XRPC method with admin credentials (so that a
// deactivated or taken-down account's repository can be read). The
// caller closes the body.
func (c *adminClient) get(ctx context.Context, nsid string, q url.Values) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/xrpc/"+nsid+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth("admin", c.password)
	return c.streamClient().Do(req)
}

// exportManifest describes an export directory.
type exportManifest struct {
	DID        string `json:"did"`
	Rev        string `json:"rev"`
	Commit     string `json:"commit"`
	ExportedAt string `json:"exportedAt"`
	Repo       string `json:"repo"`
	Blobs      int    `json:"blobs"`
	// Preferences is false: the server keeps no preferences to export.
	Preferences bool `json:"preferences"`
}

// exportAccount writes the account's repository (sync.getRepo) to
// dir/repo.car, every blob its records use (sync.listBlobs, sync.getBlob)
// to dir/blobs/<cid>, each checked against its CID, and a manifest. Files
// are written under a temporary name and renamed once complete.
func (c *adminClient) exportAccount(ctx context.Context, id, dir string, out io.Writer) error {
	did, err := c.resolveAccount(ctx, id)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, exportBlobsDir), 0o700); err != nil {
		return err
	}
	carPath := filepath.Join(dir, exportCARFile)
	if err := c.download(ctx, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}}, carPath, cid.Undef); err != nil {
		return fmt.Errorf("exporting the repository: %w", err)
	}
	commit, commitCID, err := readCommit(ctx, carPath)
	if err != nil {
		return err
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
		if err := c.xrpc(ctx, "com.atproto.sync.listBlobs", q, &page); err != nil {
			return fmt.Errorf("listing blobs: %w", err)
		}
		for _, raw := range page.CIDs {
			bc, err := cid.Decode(raw)
			if err != nil {
				return fmt.Errorf("listBlobs answered %q, not a CID", raw)
			}
			q := url.Values{"did": {did.String()}, "cid": {bc.String()}}
			if err := c.download(ctx, "com.atproto.sync.getBlob", q, filepath.Join(dir, exportBlobsDir, bc.String()), bc); err != nil {
				return fmt.Errorf("exporting blob %s: %w", bc, err)
			}
			n++
		}
		if page.Cursor == "" || len(page.CIDs) == 0 {
			break
		}
		cursor = page.Cursor
	}
	m := exportManifest{
		DID: did.String(), Rev: commit.Rev, Commit: commitCID.String(), ExportedAt: time.Now().UTC().Format(time.RFC3339),
		Repo: exportCARFile, Blobs: n,
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, exportManifestFile), append(b, '\n'), 0o600); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "exported %s (rev %s) and %d blobs to %s; preferences are not exported (the server keeps none)\n", did, commit.Rev, n, dir)
	return err
}

// download streams a GET answer into path. With want defined, the bytes
// must hash to that blob CID.
func (c *adminClient) download(ctx context.Context, nsid string, q url.Values, path string, want cid.Cid) error {
	resp, err := c.get(ctx, nsid, q)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, err := readAnswer(resp)
		return err
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

package pds

import (
	"fmt"
	"net/http"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/oauth"
)

type uploadBlobOutput struct {
	Blob atdata.Blob `json:"blob"`
}

// handleUploadBlob answers com.atproto.repo.uploadBlob: the body is
// streamed into blob storage while it is hashed, up to the configured
// limit (413 beyond it, with nothing kept). The blob stays temporary until
// a record refers to it. Deactivated accounts may upload, as with the
// reference PDS: migrating into this server uploads blobs before
// activation.
func (s *Server) handleUploadBlob(w http.ResponseWriter, r *http.Request) error {
	mime := r.Header.Get("Content-Type")
	did, err := s.uploader(r, oauthAllows("blob:"+mime, func(a *oauth.AccessInfo) bool { return a.CanBlob(mime) }))
	if err != nil {
		return err
	}
	if err := s.limitDID(w, policyUploadBlob, did); err != nil {
		return err
	}
	// The body arrives at the client's pace (held to a minimum rate by
	// serveXRPC); only storing it is foreground work, which background
	// streams give way to.
	rcv, err := s.blobs.Receive(r.Context(), r.Body)
	if err != nil {
		return err
	}
	defer rcv.Close()
	leave := s.priority.Enter()
	b, err := rcv.Store(r.Context(), did)
	leave()
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, uploadBlobOutput{Blob: b.Ref()})
}

// callerFunc returns the account a request comes from.
type callerFunc func(r *http.Request) (syntax.DID, error)

// uploader is the account an upload is for: the caller's session, or the
// test hook when set. opts add to requireAuth's (an OAuth permission).
func (s *Server) uploader(r *http.Request, opts ...authOption) (syntax.DID, error) {
	if s.callerDID != nil {
		return s.callerDID(r)
	}
	a, err := s.requireAuth(r, append([]authOption{allowDeactivated()}, opts...)...)
	if err != nil {
		return "", err
	}
	return a.DID, nil
}

type missingBlob struct {
	Cid       string `json:"cid"`
	RecordURI string `json:"recordUri"`
}

type listMissingBlobsOutput struct {
	Cursor *string       `json:"cursor,omitempty"`
	Blobs  []missingBlob `json:"blobs"`
}

// handleListMissingBlobs answers com.atproto.repo.listMissingBlobs: blobs
// the caller's records refer to that were never uploaded here (after a
// repository import), so that a migrating client knows what to upload.
func (s *Server) handleListMissingBlobs(w http.ResponseWriter, r *http.Request) error {
	did, err := s.uploader(r)
	if err != nil {
		return err
	}
	p := queryParams(r)
	limit := p.intParam("limit", 500, 1, 1000)
	cursor := p.optional("cursor")
	if err := p.Err(); err != nil {
		return err
	}
	missing, next, err := s.blobs.ListMissing(r.Context(), did, cursor, int(limit))
	if err != nil {
		return err
	}
	out := listMissingBlobsOutput{Blobs: make([]missingBlob, 0, len(missing))}
	for _, m := range missing {
		out.Blobs = append(out.Blobs, missingBlob{Cid: m.CID, RecordURI: fmt.Sprintf("at://%s/%s", did, m.RecordPath)})
	}
	if next != "" {
		out.Cursor = &next
	}
	return writeJSON(w, http.StatusOK, out)
}

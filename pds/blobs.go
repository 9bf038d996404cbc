package pds

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/bluesky-social/indigo/atproto/atdata"
	indigoauth "github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/oauth"
)

type uploadBlobOutput struct {
	Blob atdata.Blob `json:"blob"`
}

// handleUploadBlob answers com.atproto.repo.uploadBlob: the body is
// streamed into blob storage while it is hashed, up to the configured
// limit (413 beyond it, with nothing kept). The blob stays temporary until
// a record refers to it. Deactivated accounts may upload with a session,
// as with the reference PDS: migrating into this server uploads blobs
// before activation.
//
// Besides a session, uploadBlob accepts a service-auth token the account
// had this server sign for this method (auth_service.go): how the Bluesky
// app's video service puts a video into the user's repository.
//
// An OAuth session needs blob: for the type that is stored, which is
// sniffed from the bytes, not the type the client declared: the body is
// received into scratch space, its type checked against the grant, and a
// refused upload is discarded before anything is recorded. A grant with no
// blob: permission at all is refused before the body is read.
func (s *Server) handleUploadBlob(w http.ResponseWriter, r *http.Request) error {
	auth, spent, err := s.uploadBlobAuth(r)
	if err != nil {
		return err
	}
	stored := false
	defer func() {
		if !stored {
			spent.unspend(r.Context())
		}
	}()
	if err := s.limitDID(w, policyUploadBlob, auth.DID); err != nil {
		return err
	}
	// The body arrives at the client's pace (held to a minimum rate by
	// serveXRPC); only storing it is foreground work, which background
	// streams give way to.
	rcv, err := s.blobs.Receive(r.Context(), r.Body, r.Header.Get("Content-Type"))
	if err != nil {
		return err
	}
	defer rcv.Close()
	if mime := rcv.Blob().MimeType; auth.OAuth != nil && !auth.OAuth.CanBlob(mime) {
		return insufficientScope("blob:" + baseMIME(mime))
	}
	leave := s.priority.Enter()
	b, err := rcv.Store(r.Context(), auth.DID)
	leave()
	if err != nil {
		return err
	}
	stored = true
	return writeJSON(w, http.StatusOK, uploadBlobOutput{Blob: b.Ref()})
}

// uploadBlobAuth is who uploads: a service-auth token's account (and the
// token, spent), or the session's.
func (s *Server) uploadBlobAuth(r *http.Request) (*account.Auth, *spentToken, error) {
	if s.callerDID == nil && s.accounts != nil && isServiceAuth(r) {
		return s.requireUserServiceAuth(r, uploadBlobNSID)
	}
	need := "blob:*/*"
	if declared := baseMIME(r.Header.Get("Content-Type")); declared != "" && len(declared) <= 100 {
		need = "blob:" + declared
	}
	a, err := s.uploader(r, oauthAllows(need, grantsBlobs))
	return a, nil, err
}

// uploadBlobNSID is the method a service-auth token for an upload is bound
// to.
const uploadBlobNSID = "com.atproto.repo.uploadBlob"

// grantsBlobs reports whether an OAuth grant allows uploading blobs of
// some type: which type, the stored one decides once the bytes are in.
func grantsBlobs(a *oauth.AccessInfo) bool {
	if a.Generic() {
		return true
	}
	for _, tok := range strings.Fields(a.Scope()) {
		if p, err := indigoauth.ParsePermissionString(tok); err == nil && p.Resource == "blob" && len(p.Accept) > 0 {
			return true
		}
	}
	return false
}

// baseMIME is a MIME type without its parameters (text/html, not
// text/html; charset=utf-8).
func baseMIME(mime string) string {
	base, _, _ := strings.Cut(mime, ";")
	return strings.TrimSpace(base)
}

// callerFunc returns the account a request comes from.
type callerFunc func(r *http.Request) (syntax.DID, error)

// uploader is the account an upload is for: the caller's session, or the
// test hook when set. opts add to requireAuth's (an OAuth permission).
func (s *Server) uploader(r *http.Request, opts ...authOption) (*account.Auth, error) {
	if s.callerDID != nil {
		did, err := s.callerDID(r)
		if err != nil {
			return nil, err
		}
		return &account.Auth{DID: did}, nil
	}
	return s.requireAuth(r, append([]authOption{allowDeactivated()}, opts...)...)
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
	a, err := s.uploader(r)
	if err != nil {
		return err
	}
	did := a.DID
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

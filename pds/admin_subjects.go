package pds

import (
	"context"
	"errors"
	"net/http"
	"slices"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/repo"
)

// com.atproto.admin.getSubjectStatus and updateSubjectStatus: takedowns of
// accounts, records and blobs (and deactivation of accounts), and the
// checks the read methods make so that what was taken down is not served.

// statusAttr is com.atproto.admin.defs#statusAttr; the ref is shown only
// while the status applies.
func statusAttr(applied bool, ref string) *comatproto.AdminDefs_StatusAttr {
	a := &comatproto.AdminDefs_StatusAttr{Applied: applied}
	if applied && ref != "" {
		a.Ref = &ref
	}
	return a
}

// moderationAttr is a lexicon statusAttr as the account package takes it
// (nil stays nil: that status is left alone).
func moderationAttr(a *comatproto.AdminDefs_StatusAttr) *account.StatusAttr {
	if a == nil {
		return nil
	}
	return &account.StatusAttr{Applied: a.Applied, Ref: a.Ref}
}

func takedownRef(t *account.Takedown) string {
	if t == nil {
		return ""
	}
	return t.Ref
}

// recordTarget is a record named by an AT-URI in an admin request.
type recordTarget struct {
	did        syntax.DID
	collection syntax.NSID
	rkey       syntax.RecordKey
}

func (t recordTarget) uri() string { return atURI(t.did, t.collection, t.rkey) }

// parseRecordURI resolves an AT-URI naming one record of a hosted account
// (a handle authority is looked up).
func (s *Server) parseRecordURI(ctx context.Context, raw string) (recordTarget, error) {
	var t recordTarget
	u, err := syntax.ParseATURI(raw)
	if err != nil {
		return t, InvalidRequest("uri %q is not an AT-URI: %v", raw, err)
	}
	t.collection, t.rkey = u.Collection(), u.RecordKey()
	if t.collection == "" || t.rkey == "" {
		return t, InvalidRequest("uri %q does not name a record (at://<did>/<collection>/<rkey>)", raw)
	}
	a, err := s.accounts.Lookup(ctx, u.Authority().String())
	if err != nil {
		return t, err
	}
	t.did = a.DID
	return t, nil
}

func (s *Server) handleAdminGetSubjectStatus(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	rawDID, rawURI, rawBlob := p.optional("did"), p.optional("uri"), p.optional("blob")
	var out *comatproto.AdminGetSubjectStatus_Output
	var err error
	switch {
	case rawBlob != "":
		out, err = s.blobSubjectStatus(r.Context(), rawDID, rawBlob)
	case rawURI != "":
		out, err = s.recordSubjectStatus(r.Context(), rawURI)
	case rawDID != "":
		out, err = s.accountSubjectStatus(r.Context(), rawDID)
	default:
		return InvalidRequest("no subject: give did, uri, or did and blob")
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// blobSubjectStatus is getSubjectStatus for one account's blob: known if
// the account uploaded it or refers to it, or if it was taken down.
func (s *Server) blobSubjectStatus(ctx context.Context, rawDID, rawBlob string) (*comatproto.AdminGetSubjectStatus_Output, error) {
	if rawDID == "" {
		return nil, InvalidRequest("must provide a did to request blob state")
	}
	did, err := syntax.ParseDID(rawDID)
	if err != nil {
		return nil, InvalidRequest("parameter \"did\": %v", err)
	}
	c, err := cid.Decode(rawBlob)
	if err != nil {
		return nil, InvalidRequest("parameter \"blob\": %q is not a CID: %v", rawBlob, err)
	}
	if _, err := s.accounts.Get(ctx, did); errors.Is(err, account.ErrAccountNotFound) {
		return nil, subjectNotFound("account not found: %s", did)
	} else if err != nil {
		return nil, err
	}
	t, err := s.accounts.Takedown(ctx, did, account.TakedownBlob, c.String())
	if err != nil {
		return nil, err
	}
	if t == nil {
		known := false
		if s.blobs != nil {
			if known, err = s.blobs.Known(ctx, did, c); err != nil {
				return nil, err
			}
		}
		if !known {
			return nil, subjectNotFound("blob not found: %s of %s", c, did)
		}
	}
	return &comatproto.AdminGetSubjectStatus_Output{
		Subject: &comatproto.AdminGetSubjectStatus_Output_Subject{
			AdminDefs_RepoBlobRef: &comatproto.AdminDefs_RepoBlobRef{Did: did.String(), Cid: c.String()},
		},
		Takedown: statusAttr(t != nil, takedownRef(t)),
	}, nil
}

// recordSubjectStatus is getSubjectStatus for a record: known if the
// repository holds it or it was taken down (the takedown remembers the CID
// the administrator named).
func (s *Server) recordSubjectStatus(ctx context.Context, rawURI string) (*comatproto.AdminGetSubjectStatus_Output, error) {
	target, err := s.parseRecordURI(ctx, rawURI)
	if errors.Is(err, account.ErrAccountNotFound) {
		return nil, subjectNotFound("record not found: %s", rawURI)
	}
	if err != nil {
		return nil, err
	}
	t, err := s.accounts.Takedown(ctx, target.did, account.TakedownRecord, account.RecordSubject(target.collection, target.rkey))
	if err != nil {
		return nil, err
	}
	recCID := ""
	if s.repo != nil {
		rec, err := s.repo.GetRecord(ctx, target.did, target.collection, target.rkey)
		switch {
		case err == nil:
			recCID = rec.CID.String()
		case !errors.Is(err, repo.ErrRecordNotFound):
			return nil, err
		}
	}
	if recCID == "" && t != nil {
		recCID = t.CID
	}
	if recCID == "" && t == nil {
		return nil, subjectNotFound("record not found: %s", rawURI)
	}
	return &comatproto.AdminGetSubjectStatus_Output{
		Subject: &comatproto.AdminGetSubjectStatus_Output_Subject{
			RepoStrongRef: &comatproto.RepoStrongRef{Uri: target.uri(), Cid: recCID},
		},
		Takedown: statusAttr(t != nil, takedownRef(t)),
	}, nil
}

// accountSubjectStatus is getSubjectStatus for an account: its takedown
// (with the ref the administrator gave) and deactivation.
func (s *Server) accountSubjectStatus(ctx context.Context, rawDID string) (*comatproto.AdminGetSubjectStatus_Output, error) {
	did, err := syntax.ParseDID(rawDID)
	if err != nil {
		return nil, InvalidRequest("parameter \"did\": %v", err)
	}
	a, err := s.accounts.Get(ctx, did)
	if errors.Is(err, account.ErrAccountNotFound) {
		return nil, subjectNotFound("account not found: %s", did)
	}
	if err != nil {
		return nil, err
	}
	t, err := s.accounts.Takedown(ctx, did, account.TakedownAccount, "")
	if err != nil {
		return nil, err
	}
	return &comatproto.AdminGetSubjectStatus_Output{
		Subject: &comatproto.AdminGetSubjectStatus_Output_Subject{
			AdminDefs_RepoRef: &comatproto.AdminDefs_RepoRef{Did: did.String()},
		},
		Takedown:    statusAttr(a.Status == account.StatusTakendown, takedownRef(t)),
		Deactivated: statusAttr(a.Status == account.StatusDeactivated, ""),
	}, nil
}

func (s *Server) handleAdminUpdateSubjectStatus(w http.ResponseWriter, r *http.Request) error {
	var in comatproto.AdminUpdateSubjectStatus_Input
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	for _, attr := range []*comatproto.AdminDefs_StatusAttr{in.Takedown, in.Deactivated} {
		if attr != nil && attr.Ref != nil && len(*attr.Ref) > maxAdminRefLen {
			return InvalidRequest("ref is longer than %d bytes", maxAdminRefLen)
		}
	}
	var subject comatproto.AdminUpdateSubjectStatus_Output_Subject
	var err error
	switch {
	case in.Subject == nil:
		return InvalidRequest("missing required field \"subject\"")
	case in.Subject.AdminDefs_RepoRef != nil:
		subject.AdminDefs_RepoRef = in.Subject.AdminDefs_RepoRef
		err = s.updateAccountSubject(r.Context(), in.Subject.AdminDefs_RepoRef, in.Takedown, in.Deactivated)
	case in.Subject.RepoStrongRef != nil:
		subject.RepoStrongRef = in.Subject.RepoStrongRef
		err = s.updateRecordSubject(r.Context(), in.Subject.RepoStrongRef, in.Takedown)
	case in.Subject.AdminDefs_RepoBlobRef != nil:
		subject.AdminDefs_RepoBlobRef = in.Subject.AdminDefs_RepoBlobRef
		err = s.updateBlobSubject(r.Context(), in.Subject.AdminDefs_RepoBlobRef, in.Takedown)
	default:
		return InvalidRequest("subject must be a com.atproto.admin.defs#repoRef, com.atproto.repo.strongRef or com.atproto.admin.defs#repoBlobRef (with its $type)")
	}
	if err != nil {
		return err
	}
	// As the reference PDS: the subject and takedown as given.
	return writeJSON(w, http.StatusOK, comatproto.AdminUpdateSubjectStatus_Output{Subject: &subject, Takedown: in.Takedown})
}

// updateAccountSubject takes an account down (or back up), or deactivates
// it (account.Service.ModerateAccount: events, sessions, audit entry).
func (s *Server) updateAccountSubject(ctx context.Context, ref *comatproto.AdminDefs_RepoRef, takedown, deactivated *comatproto.AdminDefs_StatusAttr) error {
	did, err := syntax.ParseDID(ref.Did)
	if err != nil {
		return InvalidRequest("subject.did: %v", err)
	}
	if takedown == nil && deactivated == nil {
		return nil
	}
	m := account.Moderation{Takedown: moderationAttr(takedown), Deactivated: moderationAttr(deactivated)}
	err = s.accounts.ModerateAccount(ctx, did, m, adminEntry("updateSubjectStatus", did.String()))
	return s.adminDone(ctx, "updateSubjectStatus", did.String(), err)
}

// updateRecordSubject takes a record down or back up. Records have no
// deactivation, so only takedown counts.
func (s *Server) updateRecordSubject(ctx context.Context, ref *comatproto.RepoStrongRef, takedown *comatproto.AdminDefs_StatusAttr) error {
	target, err := s.parseRecordURI(ctx, ref.Uri)
	if err != nil {
		return err
	}
	if ref.Cid != "" {
		if _, err := cid.Decode(ref.Cid); err != nil {
			return InvalidRequest("subject.cid: %q is not a CID: %v", ref.Cid, err)
		}
	}
	if takedown == nil {
		return nil
	}
	t := &account.Takedown{DID: target.did, Kind: account.TakedownRecord,
		Subject: account.RecordSubject(target.collection, target.rkey), CID: ref.Cid, Ref: moderationAttr(takedown).RefString()}
	return s.setTakedown(ctx, t, takedown.Applied, target.uri())
}

// updateBlobSubject takes one account's blob down or back up.
func (s *Server) updateBlobSubject(ctx context.Context, ref *comatproto.AdminDefs_RepoBlobRef, takedown *comatproto.AdminDefs_StatusAttr) error {
	did, err := syntax.ParseDID(ref.Did)
	if err != nil {
		return InvalidRequest("subject.did: %v", err)
	}
	c, err := cid.Decode(ref.Cid)
	if err != nil {
		return InvalidRequest("subject.cid: %q is not a CID: %v", ref.Cid, err)
	}
	if ref.RecordUri != nil && *ref.RecordUri != "" {
		if _, err := syntax.ParseATURI(*ref.RecordUri); err != nil {
			return InvalidRequest("subject.recordUri: %v", err)
		}
	}
	if _, err := s.accounts.Get(ctx, did); err != nil {
		return err
	}
	if takedown == nil {
		return nil
	}
	t := &account.Takedown{DID: did, Kind: account.TakedownBlob, Subject: c.String(), Ref: moderationAttr(takedown).RefString()}
	return s.setTakedown(ctx, t, takedown.Applied, did.String()+"/blob/"+c.String())
}

// setTakedown applies or reverses a record's or a blob's takedown, audited
// under auditSubject.
func (s *Server) setTakedown(ctx context.Context, t *account.Takedown, applied bool, auditSubject string) error {
	err := s.accounts.SetTakedown(ctx, t, applied, adminEntry("updateSubjectStatus", auditSubject))
	return s.adminDone(ctx, "updateSubjectStatus", auditSubject, err)
}

// recordServable answers RecordNotFound for a record an administrator took
// down, as if it did not exist (repo.getRecord, sync.getRecord). Without
// accounts nothing can be taken down.
func (s *Server) recordServable(ctx context.Context, did syntax.DID, collection syntax.NSID, rkey syntax.RecordKey) error {
	if s.accounts == nil {
		return nil
	}
	down, err := s.accounts.RecordTakendown(ctx, did, collection, rkey)
	if err != nil {
		return err
	}
	if down {
		return RecordNotFound("could not locate record: %s", atURI(did, collection, rkey))
	}
	return nil
}

// withoutTakendown drops the records an administrator took down from a
// listRecords page (the page may then be shorter than the limit).
func (s *Server) withoutTakendown(ctx context.Context, did syntax.DID, collection syntax.NSID, recs []repo.Record) ([]repo.Record, error) {
	hidden, err := s.accounts.TakendownRecordKeys(ctx, did, collection)
	if err != nil || len(hidden) == 0 {
		return recs, err
	}
	return slices.DeleteFunc(recs, func(r repo.Record) bool { return hidden[r.RKey.String()] }), nil
}

// blobServable answers BlobNotFound for a blob an administrator took down.
// Without accounts nothing can be taken down.
func (s *Server) blobServable(ctx context.Context, did syntax.DID, c cid.Cid) error {
	if s.accounts == nil {
		return nil
	}
	down, err := s.accounts.BlobTakendown(ctx, did, c.String())
	if err != nil {
		return err
	}
	if down {
		return BlobNotFound("blob not found: %s has been taken down", c)
	}
	return nil
}

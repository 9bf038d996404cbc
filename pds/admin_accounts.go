package pds

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/repo"
)

// com.atproto.admin.*: what goat's `pds admin` commands call. Every method
// needs HTTP Basic admin credentials (s.admin). Every write records an
// audit entry inside the transaction of the change (account.Also, or the
// handler's own transaction for record and blob takedowns), so the audit
// log never disagrees with the state.

// adminNS is the namespace of the atproto admin methods.
const adminNS = "com.atproto.admin."

// Limits of the admin methods.
const (
	// MaxAccountInfos bounds the DIDs of one getAccountInfos call. The
	// lexicon sets none; this is sync.listRepos's largest page, so a
	// listing tool can ask about a whole page at once.
	MaxAccountInfos = 1000
	// MaxInviteCodesPage is getInviteCodes's largest page (lexicon).
	MaxInviteCodesPage = 500
	// maxAdminRefLen bounds a takedown ref, which is stored and echoed.
	maxAdminRefLen = 1024
)

func (s *Server) registerAdminAccountRoutes() {
	if s.accounts == nil {
		return
	}
	s.query(adminNS+"getAccountInfo", s.admin(s.handleAdminGetAccountInfo))
	s.query(adminNS+"getAccountInfos", s.admin(s.handleAdminGetAccountInfos))
	s.query(adminNS+"getSubjectStatus", s.admin(s.handleAdminGetSubjectStatus))
	s.procedure(adminNS+"updateSubjectStatus", s.admin(s.handleAdminUpdateSubjectStatus))
	s.procedure(adminNS+"deleteAccount", s.admin(s.handleAdminDeleteAccount))
	s.procedure(adminNS+"updateAccountHandle", s.admin(s.handleAdminUpdateAccountHandle))
	s.procedure(adminNS+"updateAccountEmail", s.admin(s.handleAdminUpdateAccountEmail))
	s.procedure(adminNS+"updateAccountPassword", s.admin(s.handleAdminUpdateAccountPassword))
	s.query(adminNS+"getInviteCodes", s.admin(s.handleAdminGetInviteCodes))
	s.procedure(adminNS+"disableInviteCodes", s.admin(s.handleAdminDisableInviteCodes))
	s.procedure(adminNS+"enableAccountInvites", s.admin(s.handleAdminEnableAccountInvites))
	s.procedure(adminNS+"disableAccountInvites", s.admin(s.handleAdminDisableAccountInvites))
}

// subjectNotFound is the reference PDS's answer for an admin subject
// (account, record, blob) it does not have: a 400 named NotFound.
func subjectNotFound(format string, args ...any) *XRPCError {
	return newError(http.StatusBadRequest, "NotFound", format, args...)
}

// adminAudit records an admin write inside tx.
func (s *Server) adminAudit(ctx context.Context, tx pgx.Tx, method, subject string, before, after any) error {
	return audit.Record(ctx, tx, &audit.Entry{
		Actor: adminActor, Action: adminNS + method, Subject: subject, Before: before, After: after,
	})
}

// adminDone logs an admin write once it has committed (err == nil) and
// passes err through.
func (s *Server) adminDone(ctx context.Context, method, subject string, err error) error {
	if err == nil {
		s.logger.Info("admin write", "method", adminNS+method, "subject", subject, "request_id", RequestID(ctx))
	}
	return err
}

// audited is adminAudit as an account.WriteOption.
func (s *Server) audited(method, subject string, before, after any) account.WriteOption {
	return account.Also(func(ctx context.Context, tx pgx.Tx) error {
		return s.adminAudit(ctx, tx, method, subject, before, after)
	})
}

func datetime(t time.Time) string { return t.UTC().Format(syntax.AtprotoDatetimeLayout) }

func inviteCodeView(c *account.InviteCode) *comatproto.ServerDefs_InviteCode {
	out := &comatproto.ServerDefs_InviteCode{
		Code: c.Code, Available: int64(c.Available), Disabled: c.Disabled, ForAccount: c.ForAccount,
		CreatedBy: c.CreatedBy, CreatedAt: datetime(c.CreatedAt),
		// Required by the lexicon: [] rather than null.
		Uses: []*comatproto.ServerDefs_InviteCodeUse{},
	}
	for _, u := range c.Uses {
		out.Uses = append(out.Uses, &comatproto.ServerDefs_InviteCodeUse{UsedBy: u.UsedBy.String(), UsedAt: datetime(u.UsedAt)})
	}
	return out
}

// accountView is com.atproto.admin.defs#accountView. Bulwark keeps no
// email confirmation time nor deactivation time, so emailConfirmedAt and
// deactivatedAt are left out rather than guessed.
func accountView(a *account.Account, d *account.AdminDetails) *comatproto.AdminDefs_AccountView {
	invitesDisabled := a.InvitesDisabled
	v := &comatproto.AdminDefs_AccountView{
		Did: a.DID.String(), Handle: a.Handle.String(), IndexedAt: datetime(a.CreatedAt),
		InvitesDisabled: &invitesDisabled,
	}
	if a.Email != "" {
		email := a.Email
		v.Email = &email
	}
	if d == nil {
		return v
	}
	if d.InvitedBy != nil {
		v.InvitedBy = inviteCodeView(d.InvitedBy)
	}
	for i := range d.Invites {
		v.Invites = append(v.Invites, inviteCodeView(&d.Invites[i]))
	}
	if d.InviteNote != "" {
		note := d.InviteNote
		v.InviteNote = &note
	}
	return v
}

func (s *Server) handleAdminGetAccountInfo(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	did := p.did("did")
	if err := p.Err(); err != nil {
		return err
	}
	a, err := s.accounts.Get(r.Context(), did)
	if errors.Is(err, account.ErrAccountNotFound) {
		return subjectNotFound("account not found: %s", did)
	}
	if err != nil {
		return err
	}
	details, err := s.accounts.AdminDetails(r.Context(), []syntax.DID{did})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, accountView(a, details[did]))
}

func (s *Server) handleAdminGetAccountInfos(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	raw := p.list("dids")
	if len(raw) == 0 {
		return InvalidRequest("missing required parameter \"dids\"")
	}
	if len(raw) > MaxAccountInfos {
		return InvalidRequest("at most %d dids per request, not %d", MaxAccountInfos, len(raw))
	}
	dids := make([]syntax.DID, 0, len(raw))
	for _, d := range raw {
		did, err := syntax.ParseDID(d)
		if err != nil {
			return InvalidRequest("parameter \"dids\": %v", err)
		}
		if !slices.Contains(dids, did) {
			dids = append(dids, did)
		}
	}
	accts, err := s.accounts.GetMany(r.Context(), dids)
	if err != nil {
		return err
	}
	details, err := s.accounts.AdminDetails(r.Context(), dids)
	if err != nil {
		return err
	}
	byDID := make(map[syntax.DID]*account.Account, len(accts))
	for _, a := range accts {
		byDID[a.DID] = a
	}
	// Unknown DIDs are left out, as the reference PDS does; the others
	// come back in the order asked.
	out := comatproto.AdminGetAccountInfos_Output{Infos: []*comatproto.AdminDefs_AccountView{}}
	for _, d := range dids {
		if a := byDID[d]; a != nil {
			out.Infos = append(out.Infos, accountView(a, details[d]))
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

// statusAttr is com.atproto.admin.defs#statusAttr; the ref is shown only
// while the status applies.
func statusAttr(applied bool, ref string) *comatproto.AdminDefs_StatusAttr {
	a := &comatproto.AdminDefs_StatusAttr{Applied: applied}
	if applied && ref != "" {
		a.Ref = &ref
	}
	return a
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
func (s *Server) parseRecordURI(ctx context.Context, raw string) (recordTarget, *account.Account, error) {
	var t recordTarget
	u, err := syntax.ParseATURI(raw)
	if err != nil {
		return t, nil, InvalidRequest("uri %q is not an AT-URI: %v", raw, err)
	}
	t.collection, t.rkey = u.Collection(), u.RecordKey()
	if t.collection == "" || t.rkey == "" {
		return t, nil, InvalidRequest("uri %q does not name a record (at://<did>/<collection>/<rkey>)", raw)
	}
	a, err := s.accounts.Lookup(ctx, u.Authority().String())
	if err != nil {
		return t, nil, err
	}
	t.did = a.DID
	return t, a, nil
}

func (s *Server) handleAdminGetSubjectStatus(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	rawDID, rawURI, rawBlob := p.optional("did"), p.optional("uri"), p.optional("blob")
	ctx := r.Context()
	var out comatproto.AdminGetSubjectStatus_Output
	switch {
	case rawBlob != "":
		if rawDID == "" {
			return InvalidRequest("must provide a did to request blob state")
		}
		did, err := syntax.ParseDID(rawDID)
		if err != nil {
			return InvalidRequest("parameter \"did\": %v", err)
		}
		c, err := cid.Decode(rawBlob)
		if err != nil {
			return InvalidRequest("parameter \"blob\": %q is not a CID: %v", rawBlob, err)
		}
		if _, err := s.accounts.Get(ctx, did); errors.Is(err, account.ErrAccountNotFound) {
			return subjectNotFound("account not found: %s", did)
		} else if err != nil {
			return err
		}
		t, err := account.GetTakedown(ctx, s.db, did, account.TakedownBlob, c.String())
		if err != nil {
			return err
		}
		if t == nil {
			known := false
			if s.blobs != nil {
				if known, err = s.blobs.Known(ctx, did, c); err != nil {
					return err
				}
			}
			if !known {
				return subjectNotFound("blob not found: %s of %s", c, did)
			}
		}
		out.Subject = &comatproto.AdminGetSubjectStatus_Output_Subject{
			AdminDefs_RepoBlobRef: &comatproto.AdminDefs_RepoBlobRef{Did: did.String(), Cid: c.String()},
		}
		out.Takedown = statusAttr(t != nil, takedownRef(t))
	case rawURI != "":
		target, _, err := s.parseRecordURI(ctx, rawURI)
		if errors.Is(err, account.ErrAccountNotFound) {
			return subjectNotFound("record not found: %s", rawURI)
		}
		if err != nil {
			return err
		}
		t, err := account.GetTakedown(ctx, s.db, target.did, account.TakedownRecord, account.RecordSubject(target.collection, target.rkey))
		if err != nil {
			return err
		}
		recCID := ""
		if s.repo != nil {
			rec, err := s.repo.GetRecord(ctx, target.did, target.collection, target.rkey)
			switch {
			case err == nil:
				recCID = rec.CID.String()
			case !errors.Is(err, repo.ErrRecordNotFound):
				return err
			}
		}
		if recCID == "" && t != nil {
			recCID = t.CID
		}
		if recCID == "" && t == nil {
			return subjectNotFound("record not found: %s", rawURI)
		}
		out.Subject = &comatproto.AdminGetSubjectStatus_Output_Subject{
			RepoStrongRef: &comatproto.RepoStrongRef{Uri: target.uri(), Cid: recCID},
		}
		out.Takedown = statusAttr(t != nil, takedownRef(t))
	case rawDID != "":
		did, err := syntax.ParseDID(rawDID)
		if err != nil {
			return InvalidRequest("parameter \"did\": %v", err)
		}
		a, err := s.accounts.Get(ctx, did)
		if errors.Is(err, account.ErrAccountNotFound) {
			return subjectNotFound("account not found: %s", did)
		}
		if err != nil {
			return err
		}
		t, err := account.GetTakedown(ctx, s.db, did, account.TakedownAccount, "")
		if err != nil {
			return err
		}
		out.Subject = &comatproto.AdminGetSubjectStatus_Output_Subject{
			AdminDefs_RepoRef: &comatproto.AdminDefs_RepoRef{Did: did.String()},
		}
		out.Takedown = statusAttr(a.Status == account.StatusTakendown, takedownRef(t))
		out.Deactivated = statusAttr(a.Status == account.StatusDeactivated, "")
	default:
		return InvalidRequest("no subject: give did, uri, or did and blob")
	}
	return writeJSON(w, http.StatusOK, out)
}

func takedownRef(t *account.Takedown) string {
	if t == nil {
		return ""
	}
	return t.Ref
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

func refOf(attr *comatproto.AdminDefs_StatusAttr) string {
	if attr == nil || attr.Ref == nil {
		return ""
	}
	return *attr.Ref
}

// updateAccountSubject takes an account down (or back up), or deactivates
// it. Account.SetStatus emits the #account event; a takedown also ends the
// account's sessions, so that reversing it does not revive them. Reversing
// a takedown of an account that is not taken down changes nothing (it must
// not reactivate a deactivated account).
func (s *Server) updateAccountSubject(ctx context.Context, ref *comatproto.AdminDefs_RepoRef, takedown, deactivated *comatproto.AdminDefs_StatusAttr) error {
	did, err := syntax.ParseDID(ref.Did)
	if err != nil {
		return InvalidRequest("subject.did: %v", err)
	}
	if takedown == nil && deactivated == nil {
		return nil
	}
	a, err := s.accounts.Get(ctx, did)
	if err != nil {
		return err
	}
	to := a.Status
	if takedown != nil {
		if takedown.Applied {
			to = account.StatusTakendown
		} else if to == account.StatusTakendown {
			to = account.StatusActive
		}
	}
	if deactivated != nil && to != account.StatusTakendown {
		if deactivated.Applied {
			to = account.StatusDeactivated
		} else if to == account.StatusDeactivated {
			to = account.StatusActive
		}
	}
	before := map[string]any{"status": a.Status}
	after := map[string]any{"status": to}
	if takedown != nil {
		after["takedown"] = takedown
	}
	if deactivated != nil {
		after["deactivated"] = deactivated
	}
	return s.adminDone(ctx, "updateSubjectStatus", did.String(), s.accounts.SetStatus(ctx, did, to, account.Also(func(ctx context.Context, tx pgx.Tx) error {
		if takedown != nil {
			if takedown.Applied {
				if err := account.PutTakedown(ctx, tx, &account.Takedown{DID: did, Kind: account.TakedownAccount, Ref: refOf(takedown)}); err != nil {
					return err
				}
				if err := account.EndSessions(ctx, tx, did); err != nil {
					return err
				}
			} else if _, err := account.RemoveTakedown(ctx, tx, did, account.TakedownAccount, ""); err != nil {
				return err
			}
		}
		return s.adminAudit(ctx, tx, "updateSubjectStatus", did.String(), before, after)
	})))
}

// updateRecordSubject takes a record down or back up. Records have no
// deactivation, so only takedown counts.
func (s *Server) updateRecordSubject(ctx context.Context, ref *comatproto.RepoStrongRef, takedown *comatproto.AdminDefs_StatusAttr) error {
	target, _, err := s.parseRecordURI(ctx, ref.Uri)
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
		Subject: account.RecordSubject(target.collection, target.rkey), CID: ref.Cid, Ref: refOf(takedown)}
	return s.putOrRemoveTakedown(ctx, t, takedown.Applied, target.uri())
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
	t := &account.Takedown{DID: did, Kind: account.TakedownBlob, Subject: c.String(), Ref: refOf(takedown)}
	return s.putOrRemoveTakedown(ctx, t, takedown.Applied, did.String()+"/blob/"+c.String())
}

func (s *Server) putOrRemoveTakedown(ctx context.Context, t *account.Takedown, applied bool, auditSubject string) error {
	return s.adminDone(ctx, "updateSubjectStatus", auditSubject, pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		before, err := account.GetTakedown(ctx, tx, t.DID, t.Kind, t.Subject)
		if err != nil {
			return err
		}
		if applied {
			if err := account.PutTakedown(ctx, tx, t); err != nil {
				return err
			}
		} else if _, err := account.RemoveTakedown(ctx, tx, t.DID, t.Kind, t.Subject); err != nil {
			return err
		}
		return s.adminAudit(ctx, tx, "updateSubjectStatus", auditSubject,
			map[string]any{"takedown": statusAttr(before != nil, takedownRef(before))},
			map[string]any{"takedown": statusAttr(applied, t.Ref)})
	}))
}

// recordServable answers RecordNotFound for a record an administrator took
// down, as if it did not exist (repo.getRecord, sync.getRecord).
func (s *Server) recordServable(ctx context.Context, did syntax.DID, collection syntax.NSID, rkey syntax.RecordKey) error {
	down, err := account.RecordTakendown(ctx, s.db, did, collection, rkey)
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
	hidden, err := account.TakendownRecordKeys(ctx, s.db, did, collection)
	if err != nil || len(hidden) == 0 {
		return recs, err
	}
	return slices.DeleteFunc(recs, func(r repo.Record) bool { return hidden[r.RKey.String()] }), nil
}

// blobServable answers BlobNotFound for a blob an administrator took down.
func (s *Server) blobServable(ctx context.Context, did syntax.DID, c cid.Cid) error {
	down, err := account.BlobTakendown(ctx, s.db, did, c.String())
	if err != nil {
		return err
	}
	if down {
		return BlobNotFound("blob not found: %s has been taken down", c)
	}
	return nil
}

func (s *Server) handleAdminDeleteAccount(w http.ResponseWriter, r *http.Request) error {
	var in comatproto.AdminDeleteAccount_Input
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	did, err := syntax.ParseDID(in.Did)
	if err != nil {
		return InvalidRequest("did: %v", err)
	}
	a, err := s.accounts.Get(r.Context(), did)
	if err != nil {
		return err
	}
	before := map[string]any{"handle": a.Handle, "email": a.Email, "status": a.Status}
	err = s.accounts.Delete(r.Context(), did, s.audited("deleteAccount", did.String(), before, map[string]any{"status": account.StatusDeleted}))
	if err := s.adminDone(r.Context(), "deleteAccount", did.String(), err); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handleAdminUpdateAccountHandle(w http.ResponseWriter, r *http.Request) error {
	var in comatproto.AdminUpdateAccountHandle_Input
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	did, err := syntax.ParseDID(in.Did)
	if err != nil {
		return InvalidRequest("did: %v", err)
	}
	handle, err := s.accounts.NormalizeHandle(in.Handle)
	if err != nil {
		return err
	}
	a, err := s.accounts.Get(r.Context(), did)
	if err != nil {
		return err
	}
	opt := s.audited("updateAccountHandle", did.String(), map[string]any{"handle": a.Handle}, map[string]any{"handle": handle})
	_, err = s.accounts.UpdateHandle(r.Context(), did, handle.String(), opt)
	if err := s.adminDone(r.Context(), "updateAccountHandle", did.String(), err); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// adminAccount resolves an at-identifier (DID or handle) to an account.
func (s *Server) adminAccount(ctx context.Context, raw string) (*account.Account, error) {
	id, err := syntax.ParseAtIdentifier(raw)
	if err != nil {
		return nil, InvalidRequest("account %q is not a DID or handle", raw)
	}
	if id.IsDID() {
		d, _ := id.AsDID()
		return s.accounts.Get(ctx, d)
	}
	h, _ := id.AsHandle()
	return s.accounts.GetByHandle(ctx, h)
}

func (s *Server) handleAdminUpdateAccountEmail(w http.ResponseWriter, r *http.Request) error {
	var in comatproto.AdminUpdateAccountEmail_Input
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	a, err := s.adminAccount(r.Context(), in.Account)
	if err != nil {
		return err
	}
	opt := s.audited("updateAccountEmail", a.DID.String(),
		map[string]any{"email": a.Email}, map[string]any{"email": strings.ToLower(strings.TrimSpace(in.Email))})
	err = s.accounts.SetEmail(r.Context(), a.DID, in.Email, opt)
	if err := s.adminDone(r.Context(), "updateAccountEmail", a.DID.String(), err); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handleAdminUpdateAccountPassword(w http.ResponseWriter, r *http.Request) error {
	var in comatproto.AdminUpdateAccountPassword_Input
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	did, err := syntax.ParseDID(in.Did)
	if err != nil {
		return InvalidRequest("did: %v", err)
	}
	// The password itself never reaches the audit log.
	opt := s.audited("updateAccountPassword", did.String(), nil, map[string]any{"password": "changed", "sessions": "ended"})
	err = s.accounts.SetPassword(r.Context(), did, in.Password, opt)
	if err := s.adminDone(r.Context(), "updateAccountPassword", did.String(), err); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handleAdminGetInviteCodes(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	sort := p.optional("sort")
	limit := int(p.intParam("limit", 100, 1, MaxInviteCodesPage))
	cursor := p.optional("cursor")
	if err := p.Err(); err != nil {
		return err
	}
	var codes []account.InviteCode
	var next string
	var err error
	switch sort {
	case "", "recent":
		codes, next, err = s.accounts.ListInviteCodes(r.Context(), cursor, limit)
	case "usage":
		codes, next, err = s.accounts.ListInviteCodesByUsage(r.Context(), cursor, limit)
	default:
		return InvalidRequest("parameter \"sort\" must be recent or usage, not %q", sort)
	}
	if err != nil {
		return err
	}
	out := comatproto.AdminGetInviteCodes_Output{Codes: make([]*comatproto.ServerDefs_InviteCode, 0, len(codes))}
	for i := range codes {
		out.Codes = append(out.Codes, inviteCodeView(&codes[i]))
	}
	if next != "" {
		out.Cursor = &next
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleAdminDisableInviteCodes(w http.ResponseWriter, r *http.Request) error {
	var in comatproto.AdminDisableInviteCodes_Input
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if slices.Contains(in.Accounts, account.InviteAdmin) {
		// As the reference PDS: "admin" names every code an administrator
		// made for nobody in particular, too broad to disable by accident.
		return InvalidRequest("cannot disable admin invite codes")
	}
	opt := s.audited("disableInviteCodes", "invite_codes", nil, map[string]any{"codes": in.Codes, "accounts": in.Accounts})
	err := s.accounts.DisableInviteCodes(r.Context(), in.Codes, in.Accounts, opt)
	if err := s.adminDone(r.Context(), "disableInviteCodes", "invite_codes", err); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handleAdminEnableAccountInvites(w http.ResponseWriter, r *http.Request) error {
	var in comatproto.AdminEnableAccountInvites_Input
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	return s.setAccountInvites(w, r, "enableAccountInvites", in.Account, in.Note, false)
}

func (s *Server) handleAdminDisableAccountInvites(w http.ResponseWriter, r *http.Request) error {
	var in comatproto.AdminDisableAccountInvites_Input
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	return s.setAccountInvites(w, r, "disableAccountInvites", in.Account, in.Note, true)
}

func (s *Server) setAccountInvites(w http.ResponseWriter, r *http.Request, method, rawDID string, note *string, disabled bool) error {
	did, err := syntax.ParseDID(rawDID)
	if err != nil {
		return InvalidRequest("account: %v", err)
	}
	a, err := s.accounts.Get(r.Context(), did)
	if err != nil {
		return err
	}
	after := map[string]any{"invitesDisabled": disabled}
	if note != nil {
		after["note"] = *note
	}
	opt := account.Also(func(ctx context.Context, tx pgx.Tx) error {
		if note != nil {
			if err := account.SetInviteNote(ctx, tx, did, *note); err != nil {
				return err
			}
		}
		return s.adminAudit(ctx, tx, method, did.String(), map[string]any{"invitesDisabled": a.InvitesDisabled}, after)
	})
	err = s.accounts.SetInvitesDisabled(r.Context(), did, disabled, opt)
	if err := s.adminDone(r.Context(), method, did.String(), err); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

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

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/audit"
)

// com.atproto.admin.*: what goat's `pds admin` commands call. Every method
// needs HTTP Basic admin credentials (s.admin). Every write records an
// audit entry inside the transaction of the change (the account package
// writes it), so the audit log never disagrees with the state. Takedowns
// and getSubjectStatus are in admin_subjects.go.

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

// adminEntry is the audit entry of an admin write; the account package
// fills in its before and after where it knows them.
func adminEntry(method, subject string) *audit.Entry {
	return &audit.Entry{Actor: adminActor, Action: adminNS + method, Subject: subject}
}

// adminDone logs an admin write once it has committed (err == nil) and
// passes err through.
func (s *Server) adminDone(ctx context.Context, method, subject string, err error) error {
	if err == nil {
		s.logger.Info("admin write", "method", adminNS+method, "subject", subject, "request_id", RequestID(ctx))
	}
	return err
}

// audited records an admin write, with the state before and after it, in
// the transaction of the change (account.Audited).
func audited(method, subject string, before, after any) account.WriteOption {
	e := adminEntry(method, subject)
	e.Before, e.After = before, after
	return account.Audited(e)
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
// deactivation time, so deactivatedAt is left out rather than guessed.
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
	if a.EmailConfirmedAt != nil {
		at := datetime(*a.EmailConfirmedAt)
		v.EmailConfirmedAt = &at
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
	err = s.accounts.Delete(r.Context(), did, audited("deleteAccount", did.String(), before, map[string]any{"status": account.StatusDeleted}))
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
	handle, err := syntax.ParseHandle(strings.TrimSpace(in.Handle))
	if err != nil {
		return newError(http.StatusBadRequest, "InvalidHandle", "invalid handle %q: %v", clip(in.Handle, maxQuoted), err)
	}
	handle = handle.Normalize()
	a, err := s.accounts.Get(r.Context(), did)
	if err != nil {
		return err
	}
	// As the reference PDS's admin method: any valid handle, a reserved
	// name under the server's domains too, and any other domain that
	// resolves to the account now.
	opt := audited("updateAccountHandle", did.String(), map[string]any{"handle": a.Handle}, map[string]any{"handle": handle})
	_, err = s.accounts.UpdateHandle(r.Context(), did, handle.String(), opt, account.AnyValidHandle(),
		account.ResolveHandlesWith(s.outbound), account.ResolveDIDsWith(s.dids))
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
	opt := audited("updateAccountEmail", a.DID.String(),
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
	opt := account.PasswordAudited(did, adminEntry("updateAccountPassword", did.String()))
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
	err := s.accounts.DisableInviteCodes(r.Context(), in.Codes, in.Accounts, adminEntry("disableInviteCodes", "invite_codes"))
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
	opt := audited(method, did.String(), map[string]any{"invitesDisabled": a.InvitesDisabled}, after)
	err = s.accounts.SetInvitesDisabled(r.Context(), did, disabled, note, opt)
	if err := s.adminDone(r.Context(), method, did.String(), err); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

package console

import (
	"crypto/rand"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/email"
)

// maxRef bounds a takedown's reference, as the admin API does.
const maxRef = 1024

// Audit actions of the console's account changes: the admin API's
// methods that make the same change.
const (
	actionSubjectStatus = "com.atproto.admin.updateSubjectStatus"
	actionPassword      = "com.atproto.admin.updateAccountPassword"
	actionInvites       = "com.atproto.server.createInviteCodes"
	actionMailReset     = "com.atproto.server.requestPasswordReset"
)

type accountsView struct {
	Query    string
	Status   string
	Accounts []*account.Account
}

func (c *Console) accounts() (*account.Service, error) {
	if c.cfg.Accounts == nil {
		return nil, notFound("This server has no accounts.")
	}
	return c.cfg.Accounts, nil
}

func (c *Console) handleAccounts(w http.ResponseWriter, r *http.Request, s session) error {
	svc, err := c.accounts()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	v := accountsView{Query: q.Get("q"), Status: q.Get("status")}
	v.Accounts, err = svc.SearchAccounts(r.Context(), account.Search{Text: v.Query, Status: account.Status(v.Status)})
	if errors.Is(err, account.ErrInvalidSearch) {
		return badRequest("%s", err.Error())
	}
	if err != nil {
		return err
	}
	return c.show(w, s, "accounts", "Accounts", "accounts", v)
}

type accountView struct {
	Account  *account.Account
	Invites  []account.InviteCode
	MailSent bool // password resets go out by mail
	Password string
	Message  string
}

// lookupAccount reads the account named by the path's DID.
func (c *Console) lookupAccount(r *http.Request) (*account.Service, *account.Account, error) {
	svc, err := c.accounts()
	if err != nil {
		return nil, nil, err
	}
	did, err := syntax.ParseDID(r.PathValue("did"))
	if err != nil {
		return nil, nil, badRequest("%q is not a DID.", truncate(100, r.PathValue("did")))
	}
	a, err := svc.Get(r.Context(), did)
	if errors.Is(err, account.ErrAccountNotFound) {
		return nil, nil, notFound("There is no account %s here.", did)
	}
	return svc, a, err
}

func (c *Console) showAccount(w http.ResponseWriter, r *http.Request, s session, svc *account.Service, a *account.Account, msg, password string) error {
	invites, err := svc.AccountInviteCodes(r.Context(), a.DID)
	if err != nil {
		return err
	}
	v := accountView{Account: a, Invites: invites, MailSent: !svc.Mail().Held() && a.Email != "", Message: msg, Password: password}
	return c.show(w, s, "accounts", a.Handle.String(), "account", v)
}

func (c *Console) handleAccount(w http.ResponseWriter, r *http.Request, s session) error {
	svc, a, err := c.lookupAccount(r)
	if err != nil {
		return err
	}
	return c.showAccount(w, r, s, svc, a, "", "")
}

// handleAccountStatus takes an account down or back up, or deactivates or
// reactivates it, as com.atproto.admin.updateSubjectStatus does.
func (c *Console) handleAccountStatus(w http.ResponseWriter, r *http.Request, s session) error {
	svc, a, err := c.lookupAccount(r)
	if err != nil {
		return err
	}
	ref := strings.TrimSpace(r.PostForm.Get("ref"))
	if len(ref) > maxRef {
		return badRequest("The reference is longer than %d bytes.", maxRef)
	}
	attr := func(applied bool) *account.StatusAttr {
		at := &account.StatusAttr{Applied: applied}
		if ref != "" {
			at.Ref = &ref
		}
		return at
	}
	var m account.Moderation
	action := r.PostForm.Get("action")
	switch action {
	case "takedown":
		m.Takedown = attr(true)
	case "untakedown":
		m.Takedown = attr(false)
	case "deactivate":
		m.Deactivated = attr(true)
	case "reactivate":
		m.Deactivated = attr(false)
	default:
		return badRequest("Unknown account action %q.", truncate(40, action))
	}
	e := &audit.Entry{Actor: AuditActor, Action: actionSubjectStatus, Subject: a.DID.String(), Reason: ref}
	if err := svc.ModerateAccount(r.Context(), a.DID, m, e); err != nil {
		if errors.Is(err, account.ErrAccountNotFound) {
			return notFound("There is no account %s here.", a.DID)
		}
		return err
	}
	c.log.Info("console account change", "did", a.DID, "action", action)
	a, err = svc.Get(r.Context(), a.DID)
	if err != nil {
		return err
	}
	return c.showAccount(w, r, s, svc, a, "Done: "+action+". The account is now "+string(a.Status)+".", "")
}

// handleResetPassword mails the account a reset code when mail goes out,
// else sets a generated password and shows it, once.
func (c *Console) handleResetPassword(w http.ResponseWriter, r *http.Request, s session) error {
	svc, a, err := c.lookupAccount(r)
	if err != nil {
		return err
	}
	if !svc.Mail().Held() && a.Email != "" && r.PostForm.Get("generate") == "" {
		e := &audit.Entry{Actor: AuditActor, Action: actionMailReset, Subject: a.DID.String(), After: map[string]any{"mailedTo": a.Email}}
		if err := svc.RequestEmailCode(r.Context(), a.DID, email.PurposeResetPassword, account.Audited(e)); err != nil {
			return err
		}
		c.log.Info("console password reset mailed", "did", a.DID)
		return c.showAccount(w, r, s, svc, a, "A password reset code was mailed to "+a.Email+".", "")
	}
	pw := rand.Text()
	e := &audit.Entry{Actor: AuditActor, Action: actionPassword, Subject: a.DID.String()}
	if err := svc.SetPassword(r.Context(), a.DID, pw, account.PasswordAudited(a.DID, e)); err != nil {
		return err
	}
	c.log.Info("console password reset", "did", a.DID)
	return c.showAccount(w, r, s, svc, a, "The password was replaced; the account's sessions and app passwords are ended. It is shown once.", pw)
}

type invitesView struct {
	Codes   []account.InviteCode
	Cursor  string
	Created []string
}

func (c *Console) handleInvites(w http.ResponseWriter, r *http.Request, s session) error {
	return c.showInvites(w, r, s, nil)
}

func (c *Console) showInvites(w http.ResponseWriter, r *http.Request, s session, created []string) error {
	svc, err := c.accounts()
	if err != nil {
		return err
	}
	cursor := r.URL.Query().Get("cursor")
	if len(cursor) > 256 {
		return badRequest("The cursor is too long.")
	}
	codes, next, err := svc.ListInviteCodes(r.Context(), cursor, 50)
	if err != nil {
		return err
	}
	return c.show(w, s, "invites", "Invite codes", "invites", invitesView{Codes: codes, Cursor: next, Created: created})
}

// handleCreateInvites makes invite codes for nobody in particular (or for
// one account), as com.atproto.server.createInviteCodes does.
func (c *Console) handleCreateInvites(w http.ResponseWriter, r *http.Request, s session) error {
	svc, err := c.accounts()
	if err != nil {
		return err
	}
	count, err1 := strconv.Atoi(strings.TrimSpace(r.PostForm.Get("count")))
	uses, err2 := strconv.Atoi(strings.TrimSpace(r.PostForm.Get("uses")))
	if err1 != nil || err2 != nil || count < 1 || count > 100 || uses < 1 || uses > account.MaxInviteUses {
		return badRequest("Make between 1 and 100 codes of 1 to %d uses each.", account.MaxInviteUses)
	}
	var forAccounts []string
	if f := strings.TrimSpace(r.PostForm.Get("for")); f != "" {
		did, err := syntax.ParseDID(f)
		if err != nil {
			return badRequest("%q is not a DID.", truncate(100, f))
		}
		forAccounts = []string{did.String()}
	}
	subject := "invite_codes"
	if len(forAccounts) == 1 {
		subject = forAccounts[0]
	}
	e := &audit.Entry{Actor: AuditActor, Action: actionInvites, Subject: subject}
	codes, err := svc.CreateInviteCodes(r.Context(), count, uses, forAccounts, account.InviteAdmin, e)
	if errors.Is(err, account.ErrInvalidInviteCode) {
		return badRequest("%s", err.Error())
	}
	if err != nil {
		return err
	}
	var created []string
	for _, cs := range codes {
		created = append(created, cs...)
	}
	c.log.Info("console invite codes created", "count", len(created), "uses", uses, "action", actionInvites)
	return c.showInvites(w, r, s, created)
}

package pds

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/audit"
)

// registerAccountRoutes registers account creation, app passwords, invite
// codes and the account lifecycle.
func (s *Server) registerAccountRoutes() {
	if s.accounts == nil {
		return
	}
	s.procedure("com.atproto.server.createAccount", s.handleCreateAccount, hashesPassword())
	s.procedure("com.atproto.server.createAppPassword", s.handleCreateAppPassword, hashesPassword())
	s.query("com.atproto.server.listAppPasswords", s.handleListAppPasswords)
	s.procedure("com.atproto.server.revokeAppPassword", s.handleRevokeAppPassword)
	s.procedure("com.atproto.server.createInviteCode", s.handleCreateInviteCode)
	s.procedure("com.atproto.server.createInviteCodes", s.handleCreateInviteCodes)
	s.query("com.atproto.server.getAccountInviteCodes", s.handleGetAccountInviteCodes)
	s.procedure("com.atproto.server.activateAccount", s.handleActivateAccount)
	s.procedure("com.atproto.server.deactivateAccount", s.handleDeactivateAccount)
	s.query("com.atproto.server.checkAccountStatus", s.handleCheckAccountStatus)
	s.procedure("com.atproto.server.deleteAccount", s.handleDeleteAccount)
	s.procedure("com.atproto.server.reserveSigningKey", s.handleReserveSigningKey)
	s.query("com.atproto.temp.checkSignupQueue", s.handleCheckSignupQueue)
}

// handleReserveSigningKey answers com.atproto.server.reserveSigningKey:
// anyone may ask (as of the reference PDS), and nothing is stored: the key
// reserved for a DID is derived from it (account.ReserveSigningKey), and
// createAccount for that DID uses it.
func (s *Server) handleReserveSigningKey(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		DID string `json:"did"`
	}
	if r.ContentLength != 0 {
		if err := decodeJSON(r, &in); err != nil {
			return err
		}
	}
	key, err := s.accounts.ReserveSigningKey(in.DID)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]string{"signingKey": key})
}

// handleCheckSignupQueue answers com.atproto.temp.checkSignupQueue as the
// reference PDS does without an entryway: this server has no sign-up
// queue, so every account is activated. OAuth sessions are refused, as
// there.
func (s *Server) handleCheckSignupQueue(w http.ResponseWriter, r *http.Request) error {
	if isDPoPAuth(r) {
		return Forbidden("OAuth credentials are not supported for this endpoint")
	}
	if _, err := s.requireAuth(r, allowDeactivated()); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]bool{"activated": true})
}

type createAccountInput struct {
	Email       string          `json:"email"`
	Handle      string          `json:"handle"`
	DID         string          `json:"did"`
	InviteCode  string          `json:"inviteCode"`
	Password    string          `json:"password"`
	RecoveryKey string          `json:"recoveryKey"`
	PlcOp       json.RawMessage `json:"plcOp"`
}

// parsePLCOp reads createAccount's plcOp: absent or null is nil; anything
// else must be a PLC operation of type plc_operation (the account's
// checks come later: account.CreateInput.PLCOp).
func parsePLCOp(raw json.RawMessage) (*didplc.RegularOp, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var op didplc.RegularOp
	if err := json.Unmarshal(raw, &op); err != nil || op.Type != "plc_operation" {
		return nil, newError(http.StatusBadRequest, "IncompatibleDidDoc", "invalid plc operation: plcOp must be a signed plc_operation")
	}
	return &op, nil
}

type createAccountOutput struct {
	AccessJwt  string       `json:"accessJwt"`
	RefreshJwt string       `json:"refreshJwt"`
	Handle     string       `json:"handle"`
	DID        string       `json:"did"`
	DIDDoc     *didDocument `json:"didDoc,omitempty"`
}

func (s *Server) handleCreateAccount(w http.ResponseWriter, r *http.Request) error {
	if err := s.limitIP(w, r, policyCreateAccount); err != nil {
		return err
	}
	var in createAccountInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	op, err := parsePLCOp(in.PlcOp)
	if err != nil {
		return err
	}
	if in.Handle == "" {
		return newError(http.StatusBadRequest, "InvalidHandle", "handle is required")
	}
	if in.Password == "" {
		return newError(http.StatusBadRequest, "InvalidPassword", "password is required")
	}
	var e *audit.Entry
	if _, _, ok := r.BasicAuth(); ok {
		// An administrator making an account (bulwark admin account
		// create): checked like every admin call, and audited.
		if err := s.requireAdmin(r); err != nil {
			return err
		}
		e = &audit.Entry{Actor: adminActor, Action: "com.atproto.server.createAccount"}
	}
	var use *account.ServiceAuthUse
	if in.DID != "" && op == nil {
		// An account moving here: the requester must prove control of
		// the DID before anything is stored. (With a plcOp, the
		// operation, signed by a rotation key of the DID, is the proof.)
		if use, err = s.verifyMigrationAuth(r, in.DID); err != nil {
			return err
		}
	}
	a, sess, err := s.accounts.CreateAccount(r.Context(), account.CreateInput{
		Handle: in.Handle, Email: in.Email, Password: in.Password, InviteCode: in.InviteCode, DID: in.DID, Audit: e, ServiceAuth: use,
		RecoveryKey: in.RecoveryKey, PLCOp: op,
		// A handle of the user's own domain is checked as it resolves
		// now, through the guarded client and without a cache.
		Handles: account.HandleResolver(s.outbound), DIDs: s.dids,
	})
	if err != nil {
		return err
	}
	if e != nil {
		s.logger.Info("admin write", "method", e.Action, "subject", e.Subject, "request_id", RequestID(r.Context()))
	}
	var doc *didDocument
	if a.Active() {
		// A moving account's document still names its old server until
		// it is changed; none is made up for it.
		if doc, err = s.didDoc(r.Context(), a); err != nil {
			return err
		}
	}
	return writeJSON(w, http.StatusOK, createAccountOutput{
		AccessJwt: sess.AccessJwt, RefreshJwt: sess.RefreshJwt, Handle: a.Handle.String(), DID: a.DID.String(), DIDDoc: doc,
	})
}

type createAppPasswordInput struct {
	Name       string `json:"name"`
	Privileged bool   `json:"privileged"`
}

type appPasswordOutput struct {
	Name       string `json:"name"`
	Password   string `json:"password,omitempty"`
	CreatedAt  string `json:"createdAt"`
	Privileged bool   `json:"privileged"`
}

func appPasswordJSON(ap account.AppPassword) appPasswordOutput {
	return appPasswordOutput{Name: ap.Name, Password: ap.Password, CreatedAt: ap.CreatedAt.UTC().Format(syntax.AtprotoDatetimeLayout), Privileged: ap.Privileged}
}

func (s *Server) handleCreateAppPassword(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, fullAccessOnly())
	if err != nil {
		return err
	}
	var in createAppPasswordInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	ap, err := s.accounts.CreateAppPassword(r.Context(), auth.DID, in.Name, in.Privileged)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, appPasswordJSON(*ap))
}

func (s *Server) handleListAppPasswords(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, fullAccessOnly(), allowDeactivated())
	if err != nil {
		return err
	}
	aps, err := s.accounts.ListAppPasswords(r.Context(), auth.DID)
	if err != nil {
		return err
	}
	out := struct {
		Passwords []appPasswordOutput `json:"passwords"`
	}{Passwords: make([]appPasswordOutput, 0, len(aps))}
	for _, ap := range aps {
		out.Passwords = append(out.Passwords, appPasswordJSON(ap))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleRevokeAppPassword(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, fullAccessOnly(), allowDeactivated())
	if err != nil {
		return err
	}
	var in struct {
		Name string `json:"name"`
	}
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if in.Name == "" {
		return InvalidRequest("name is required")
	}
	if err := s.accounts.RevokeAppPassword(r.Context(), auth.DID, in.Name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// inviteSubject is the audit subject of invite codes made for accounts:
// the account when there is one, else the codes as a whole (as
// disableInviteCodes records them).
func inviteSubject(forAccounts []string) string {
	if len(forAccounts) == 1 {
		return forAccounts[0]
	}
	return "invite_codes"
}

func (s *Server) handleCreateInviteCode(w http.ResponseWriter, r *http.Request) error {
	if err := s.requireAdmin(r); err != nil {
		return err
	}
	var in struct {
		UseCount   int    `json:"useCount"`
		ForAccount string `json:"forAccount"`
	}
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	var for_ []string
	if in.ForAccount != "" {
		for_ = []string{in.ForAccount}
	}
	const method = "com.atproto.server.createInviteCode"
	e := &audit.Entry{Actor: adminActor, Action: method, Subject: inviteSubject(for_)}
	codes, err := s.accounts.CreateInviteCodes(r.Context(), 1, in.UseCount, for_, account.InviteAdmin, e)
	if err == nil {
		s.logger.Info("admin write", "method", method, "subject", e.Subject, "request_id", RequestID(r.Context()))
	}
	if err != nil {
		return err
	}
	for _, cs := range codes {
		return writeJSON(w, http.StatusOK, map[string]string{"code": cs[0]})
	}
	return InternalServerError()
}

func (s *Server) handleCreateInviteCodes(w http.ResponseWriter, r *http.Request) error {
	if err := s.requireAdmin(r); err != nil {
		return err
	}
	var in struct {
		CodeCount   int      `json:"codeCount"`
		UseCount    int      `json:"useCount"`
		ForAccounts []string `json:"forAccounts"`
	}
	in.CodeCount = 1
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	const method = "com.atproto.server.createInviteCodes"
	e := &audit.Entry{Actor: adminActor, Action: method, Subject: inviteSubject(in.ForAccounts)}
	codes, err := s.accounts.CreateInviteCodes(r.Context(), in.CodeCount, in.UseCount, in.ForAccounts, account.InviteAdmin, e)
	if err == nil {
		s.logger.Info("admin write", "method", method, "subject", e.Subject, "request_id", RequestID(r.Context()))
	}
	if err != nil {
		return err
	}
	type accountCodes struct {
		Account string   `json:"account"`
		Codes   []string `json:"codes"`
	}
	out := struct {
		Codes []accountCodes `json:"codes"`
	}{}
	order := in.ForAccounts
	if len(order) == 0 {
		order = []string{account.InviteAdmin}
	}
	for _, acct := range order {
		if cs, ok := codes[acct]; ok {
			out.Codes = append(out.Codes, accountCodes{Account: acct, Codes: cs})
			delete(codes, acct)
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

type inviteCodeOutput struct {
	Code       string          `json:"code"`
	Available  int             `json:"available"`
	Disabled   bool            `json:"disabled"`
	ForAccount string          `json:"forAccount"`
	CreatedBy  string          `json:"createdBy"`
	CreatedAt  string          `json:"createdAt"`
	Uses       []inviteUseJSON `json:"uses"`
}

type inviteUseJSON struct {
	UsedBy string `json:"usedBy"`
	UsedAt string `json:"usedAt"`
}

func (s *Server) handleGetAccountInviteCodes(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, fullAccessOnly())
	if err != nil {
		return err
	}
	codes, err := s.accounts.AccountInviteCodes(r.Context(), auth.DID)
	if err != nil {
		return err
	}
	out := struct {
		Codes []inviteCodeOutput `json:"codes"`
	}{Codes: []inviteCodeOutput{}}
	for _, c := range codes {
		ic := inviteCodeOutput{Code: c.Code, Available: c.Available, Disabled: c.Disabled, ForAccount: c.ForAccount,
			CreatedBy: c.CreatedBy, CreatedAt: c.CreatedAt.UTC().Format(syntax.AtprotoDatetimeLayout), Uses: []inviteUseJSON{}}
		for _, u := range c.Uses {
			ic.Uses = append(ic.Uses, inviteUseJSON{UsedBy: u.UsedBy.String(), UsedAt: u.UsedAt.UTC().Format(syntax.AtprotoDatetimeLayout)})
		}
		out.Codes = append(out.Codes, ic)
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleActivateAccount(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, allowDeactivated(), fullAccessOnly())
	if err != nil {
		return err
	}
	// As the reference PDS does: an account whose DID document does not
	// name this server (a move not finished) is not announced as hosted
	// here.
	if err := s.accounts.CheckDIDDocument(r.Context(), auth.DID, s.dids); err != nil {
		return err
	}
	if err := s.accounts.Activate(r.Context(), auth.DID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handleDeactivateAccount(w http.ResponseWriter, r *http.Request) error {
	// A taken-down account may call it, as the last step of moving away
	// (the reference PDS allows it); its status stays takendown, which
	// already says it is not served here.
	auth, err := s.requireAuth(r, allowDeactivated(), allowTakendown(), fullAccessOnly())
	if err != nil {
		return err
	}
	var in struct {
		DeleteAfter string `json:"deleteAfter"`
	}
	if r.ContentLength != 0 {
		if err := decodeJSON(r, &in); err != nil {
			return err
		}
	}
	if in.DeleteAfter != "" {
		if _, err := time.Parse(time.RFC3339, in.DeleteAfter); err != nil {
			return InvalidRequest("deleteAfter %q is not a datetime", in.DeleteAfter)
		}
	}
	if err := s.accounts.Deactivate(r.Context(), auth.DID, s.dids); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

type checkAccountStatusOutput struct {
	Activated          bool   `json:"activated"`
	ValidDid           bool   `json:"validDid"`
	RepoCommit         string `json:"repoCommit"`
	RepoRev            string `json:"repoRev"`
	RepoBlocks         int64  `json:"repoBlocks"`
	IndexedRecords     int64  `json:"indexedRecords"`
	PrivateStateValues int64  `json:"privateStateValues"`
	ExpectedBlobs      int64  `json:"expectedBlobs"`
	ImportedBlobs      int64  `json:"importedBlobs"`
}

func (s *Server) handleCheckAccountStatus(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, allowDeactivated())
	if err != nil {
		return err
	}
	ctx := r.Context()
	out := checkAccountStatusOutput{Activated: auth.Status == account.StatusActive}
	// validDid: whether the DID document makes this server the account's
	// PDS (false too when the directory cannot be reached).
	out.ValidDid = s.accounts.CheckDIDDocument(ctx, auth.DID, s.dids) == nil
	if s.repo != nil {
		head, err := s.repo.GetHead(ctx, auth.DID)
		if err != nil {
			return err
		}
		if out.IndexedRecords, err = s.repo.CountRecords(ctx, auth.DID); err != nil {
			return err
		}
		if out.RepoBlocks, err = s.repo.CountBlocks(ctx, auth.DID); err != nil {
			return err
		}
		out.RepoCommit, out.RepoRev = head.Commit.String(), head.Rev
	}
	if s.blobs != nil {
		var err error
		if out.ExpectedBlobs, out.ImportedBlobs, err = s.blobs.Counts(ctx, auth.DID); err != nil {
			return err
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

type deleteAccountInput struct {
	DID      string `json:"did"`
	Password string `json:"password"`
	Token    string `json:"token"`
}

// handleDeleteAccount deletes an account given its DID, its password and
// a delete_account code mailed by requestAccountDelete, as the reference
// PDS does; no session is needed. A wrong password is 401 whether or not
// the account exists; a wrong or used code is 400 InvalidToken, an
// expired one ExpiredToken, and neither deletes anything.
func (s *Server) handleDeleteAccount(w http.ResponseWriter, r *http.Request) error {
	if err := s.limitIP(w, r, policyDeleteAccount); err != nil {
		return err
	}
	var in deleteAccountInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	did, err := syntax.ParseDID(in.DID)
	if err != nil {
		return InvalidRequest("did %q is not a DID", in.DID)
	}
	if in.Password == "" {
		return InvalidRequest("password is required")
	}
	if in.Token == "" {
		return InvalidRequest("token is required: request one with com.atproto.server.requestAccountDelete")
	}
	if len(in.Password) > account.MaxPasswordLength {
		return account.ErrAuthFailed
	}
	if err := s.accounts.DeleteWithCode(r.Context(), did, in.Password, in.Token); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

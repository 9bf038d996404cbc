package pds

import (
	"errors"
	"net/http"
	"strings"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// The methods that mail a code and the ones that use it
// (com.atproto.server email and password flows, requestAccountDelete,
// com.atproto.identity.requestPlcOperationSignature), the administrator's
// com.atproto.admin.sendEmail, and Bulwark's own getPendingEmailTokens,
// with which an operator reads codes that have not gone out by mail (no
// SMTP server configured, or the mail server down). deleteAccount, which
// uses a delete_account code, is with the account lifecycle
// (server_accounts.go). Codes are never logged: not here, and the access
// log records no bodies.

// Rate-limit policies of the mail methods (ratelimit.Policy*).
const (
	policyRequestPasswordReset         = ratelimit.PolicyRequestPasswordReset
	policyRequestEmailConfirmation     = ratelimit.PolicyRequestEmailConfirmation
	policyRequestEmailUpdate           = ratelimit.PolicyRequestEmailUpdate
	policyRequestAccountDelete         = ratelimit.PolicyRequestAccountDelete
	policyRequestPlcOperationSignature = ratelimit.PolicyRequestPlcOperationSignature
)

// auditReadPendingTokens is the audit action of getPendingEmailTokens:
// reading an account's codes is as good as reading its mail.
const auditReadPendingTokens = "email.readPendingTokens"

func (s *Server) registerEmailRoutes() {
	if s.accounts == nil {
		return
	}
	s.procedure("com.atproto.server.requestEmailConfirmation", s.handleRequestEmailConfirmation)
	s.procedure("com.atproto.server.confirmEmail", s.handleConfirmEmail)
	s.procedure("com.atproto.server.requestEmailUpdate", s.handleRequestEmailUpdate)
	s.procedure("com.atproto.server.updateEmail", s.handleUpdateEmail)
	s.procedure("com.atproto.server.requestPasswordReset", s.handleRequestPasswordReset)
	s.procedure("com.atproto.server.resetPassword", s.handleResetPassword, hashesPassword())
	s.procedure("com.atproto.server.requestAccountDelete", s.handleRequestAccountDelete)
	s.procedure("com.atproto.identity.requestPlcOperationSignature", s.handleRequestPlcOperationSignature)
	s.procedure(adminNS+"sendEmail", s.admin(s.handleAdminSendEmail))
	s.query(AdminNSIDPrefix+"getPendingEmailTokens", s.admin(s.handleGetPendingEmailTokens))
}

// requestCode is the handler of a method that mails the caller a code for
// purpose, under policy (per account).
func (s *Server) requestCode(purpose email.Purpose, policy string, opts ...authOption) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		auth, err := s.requireAuth(r, append(opts, allowDeactivated())...)
		if err != nil {
			return err
		}
		if err := s.limitDID(w, policy, auth.DID); err != nil {
			return err
		}
		if err := s.accounts.RequestEmailCode(r.Context(), auth.DID, purpose); err != nil {
			return err
		}
		w.WriteHeader(http.StatusOK)
		return nil
	}
}

// handleRequestEmailConfirmation mails a confirm_email code. Any session
// may ask, as with the reference PDS (app passwords included).
func (s *Server) handleRequestEmailConfirmation(w http.ResponseWriter, r *http.Request) error {
	return s.requestCode(email.PurposeConfirmEmail, policyRequestEmailConfirmation, oauthAccount("email", oauth.ActionManage))(w, r)
}

// handleRequestAccountDelete mails a delete_account code, which
// deleteAccount wants with the password.
func (s *Server) handleRequestAccountDelete(w http.ResponseWriter, r *http.Request) error {
	return s.requestCode(email.PurposeDeleteAccount, policyRequestAccountDelete, fullAccessOnly())(w, r)
}

// handleRequestPlcOperationSignature mails a plc_operation code, which
// com.atproto.identity.signPlcOperation wants.
func (s *Server) handleRequestPlcOperationSignature(w http.ResponseWriter, r *http.Request) error {
	// A taken-down account may ask too: it signs the operation that moves
	// it away.
	return s.requestCode(email.PurposePLCOperation, policyRequestPlcOperationSignature, fullAccessOnly(), allowTakendown(), oauthIdentity("*"))(w, r)
}

type confirmEmailInput struct {
	Email string `json:"email"`
	Token string `json:"token"`
}

func (s *Server) handleConfirmEmail(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, allowDeactivated(), oauthAccount("email", oauth.ActionManage))
	if err != nil {
		return err
	}
	var in confirmEmailInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if strings.TrimSpace(in.Email) == "" || in.Token == "" {
		return InvalidRequest("email and token are required")
	}
	if err := s.accounts.ConfirmEmail(r.Context(), auth.DID, in.Email, in.Token); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handleRequestEmailUpdate(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, fullAccessOnly(), allowDeactivated(), oauthAccount("email", oauth.ActionManage))
	if err != nil {
		return err
	}
	if err := s.limitDID(w, policyRequestEmailUpdate, auth.DID); err != nil {
		return err
	}
	required, err := s.accounts.RequestEmailUpdate(r.Context(), auth.DID)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, comatproto.ServerRequestEmailUpdate_Output{TokenRequired: required})
}

type updateEmailInput struct {
	Email           string `json:"email"`
	Token           string `json:"token"`
	EmailAuthFactor *bool  `json:"emailAuthFactor"`
}

func (s *Server) handleUpdateEmail(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, fullAccessOnly(), allowDeactivated(), oauthAccount("email", oauth.ActionManage))
	if err != nil {
		return err
	}
	var in updateEmailInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if strings.TrimSpace(in.Email) == "" {
		return InvalidRequest("email is required")
	}
	// emailAuthFactor turns sign-in codes on or off; with a confirmed
	// address that, like any change here, needs the mailed update code.
	if err := s.accounts.UpdateEmail(r.Context(), auth.DID, in.Email, in.Token, in.EmailAuthFactor); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// handleRequestPasswordReset mails a reset_password code to the account
// with the address, if there is one. The answer is the same either way,
// so that it does not tell who has an account here; the reference PDS
// answers an unknown address with an error.
func (s *Server) handleRequestPasswordReset(w http.ResponseWriter, r *http.Request) error {
	if err := s.limitIP(w, r, policyRequestPasswordReset); err != nil {
		return err
	}
	var in struct {
		Email string `json:"email"`
	}
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if strings.TrimSpace(in.Email) == "" {
		return InvalidRequest("email is required")
	}
	if err := s.accounts.RequestPasswordReset(r.Context(), in.Email); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

type resetPasswordInput struct {
	Token    string `json:"token"`
	Password string `json:"password"`
}

// handleResetPassword sets a new password with a reset_password code and
// ends every session and app password of the account, in one
// transaction.
func (s *Server) handleResetPassword(w http.ResponseWriter, r *http.Request) error {
	if err := s.limitIP(w, r, policyResetPassword); err != nil {
		return err
	}
	var in resetPasswordInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if in.Token == "" {
		return InvalidRequest("token is required: request one with com.atproto.server.requestPasswordReset")
	}
	if in.Password == "" {
		return newError(http.StatusBadRequest, "InvalidPassword", "password is required")
	}
	if _, err := s.accounts.ResetPassword(r.Context(), in.Token, in.Password); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handleAdminSendEmail(w http.ResponseWriter, r *http.Request) error {
	var in comatproto.AdminSendEmail_Input
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	did, err := syntax.ParseDID(in.RecipientDid)
	if err != nil {
		return InvalidRequest("recipientDid: %v", err)
	}
	sender, err := syntax.ParseDID(in.SenderDid)
	if err != nil {
		return InvalidRequest("senderDid: %v", err)
	}
	if strings.TrimSpace(in.Content) == "" {
		return InvalidRequest("content is required")
	}
	subject, comment := stringOrEmpty(in.Subject), stringOrEmpty(in.Comment)
	if len(comment) > email.MaxAdminSubjectLen {
		return InvalidRequest("comment is longer than %d bytes", email.MaxAdminSubjectLen)
	}
	// The audit entry keeps who sent what about, not the message itself.
	opt := audited("sendEmail", did.String(), nil, map[string]any{
		"senderDid": sender.String(), "subject": subject, "comment": comment, "contentBytes": len(in.Content),
	})
	err = s.accounts.SendAdminEmail(r.Context(), did, subject, in.Content, opt)
	switch err := s.adminDone(r.Context(), "sendEmail", did.String(), err); {
	case isAccountNotFound(err):
		return subjectNotFound("recipient not found: %s", did)
	case err != nil:
		return err
	}
	return writeJSON(w, http.StatusOK, comatproto.AdminSendEmail_Output{Sent: true})
}

// pendingTokenJSON is one code of getPendingEmailTokens.
type pendingTokenJSON struct {
	Purpose   string `json:"purpose"`
	Code      string `json:"code"`
	ExpiresAt string `json:"expiresAt"`
}

// handleGetPendingEmailTokens is io.github.bulwark-pds.admin.getPendingEmailTokens
// (account: a DID or handle): the account's codes whose mail has not been
// sent, oldest first, and whether this server sends mail at all. Each
// call is recorded in the audit log, without the codes.
func (s *Server) handleGetPendingEmailTokens(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	raw := p.required("account")
	if err := p.Err(); err != nil {
		return err
	}
	a, err := s.adminAccount(r.Context(), raw)
	if isAccountNotFound(err) {
		return subjectNotFound("account not found: %s", raw)
	}
	if err != nil {
		return err
	}
	opt := account.Audited(&audit.Entry{Actor: adminActor, Action: auditReadPendingTokens, Subject: a.DID.String()})
	pending, err := s.accounts.PendingEmailTokens(r.Context(), a.DID, opt)
	if err != nil {
		return err
	}
	out := struct {
		DID         string             `json:"did"`
		Handle      string             `json:"handle"`
		MailEnabled bool               `json:"mailEnabled"`
		Tokens      []pendingTokenJSON `json:"tokens"`
	}{DID: a.DID.String(), Handle: a.Handle.String(), MailEnabled: !s.accounts.Mail().Held(), Tokens: []pendingTokenJSON{}}
	for _, t := range pending {
		out.Tokens = append(out.Tokens, pendingTokenJSON{Purpose: string(t.Purpose), Code: t.Code, ExpiresAt: datetime(t.ExpiresAt)})
	}
	return writeJSON(w, http.StatusOK, out)
}

// describeServerOutput is describeServer's answer: the lexicon's output,
// the reference PDS's blobUploadLimit, and emailAvailable, a field of
// Bulwark's own (clients ignore fields they do not know): false when no
// SMTP server is configured, so that a client or an operator can tell why
// no code arrives (the codes wait for the operator, who reads them with
// `bulwark admin account tokens`).
type describeServerOutput struct {
	*comatproto.ServerDescribeServer_Output
	BlobUploadLimit int64 `json:"blobUploadLimit,omitempty"`
	EmailAvailable  bool  `json:"emailAvailable"`
}

func (s *Server) describeServer(out *comatproto.ServerDescribeServer_Output) describeServerOutput {
	return describeServerOutput{
		ServerDescribeServer_Output: out,
		BlobUploadLimit:             s.cfg.BlobMaxBytes,
		EmailAvailable:              s.accounts != nil && !s.accounts.Mail().Held(),
	}
}

// isAccountNotFound reports whether err says the account does not exist.
func isAccountNotFound(err error) bool { return errors.Is(err, account.ErrAccountNotFound) }

// stringOrEmpty is *p, or "" for nil.
func stringOrEmpty(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

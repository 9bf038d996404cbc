package account

import (
	"context"
	"errors"
	"fmt"
	"net/mail"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/repo"
)

// CreateInput is what createAccount asks for.
type CreateInput struct {
	Handle     string
	Email      string
	Password   string
	InviteCode string
	// DID, when set, brings an existing did:plc or did:web here (an
	// account moving from another server): the caller must have checked
	// that the requester controls it (a service-auth JWT the DID issued
	// for com.atproto.server.createAccount), unless PLCOp proves it. See
	// createImported.
	DID string
	// Audit, when set, is recorded in the audit log in the account's
	// transaction (an administrator's creation), its Subject and After
	// filled in with the new account.
	Audit *audit.Entry
	// ServiceAuth is that JWT, recorded as used in the account's
	// transaction; required with DID.
	ServiceAuth *ServiceAuthUse
	// RecoveryKey, when set, is the account holder's own rotation key (a
	// did:key, K-256 or P-256), first among the new DID's rotation keys,
	// ahead of the server's. Ignored with DID or PLCOp, as in the
	// reference PDS: that DID's keys are its holder's business.
	RecoveryKey string
	// PLCOp, when set, is a PLC operation the account holder signed
	// that makes this server the DID's PDS: a genesis (a new did:plc of
	// the holder's own) or the update that moves DID here. It is checked
	// and submitted with the account (see createWithOp).
	PLCOp *didplc.RegularOp
	// Handles resolves a handle outside the server's domains for an
	// account with an existing DID (CheckHandle); nil: only the server's
	// domains.
	Handles HandleResolver
	// DIDs fetches did:web documents; nil: no did:web is accepted.
	DIDs DocResolver
}

// auditCreation records in's audit entry, if any, for the new account did
// inside tx.
func auditCreation(ctx context.Context, tx db.DBTX, in *audit.Entry, did syntax.DID, na *newAccount, status Status) error {
	if in == nil {
		return nil
	}
	in.Subject = did.String()
	after := map[string]any{"handle": na.handle, "email": na.email, "status": status}
	if na.invite != "" {
		after["inviteCode"] = na.invite
	}
	in.After = after
	return audit.Record(ctx, tx, in)
}

// checkRecoveryKey checks createAccount's recoveryKey: a did:key of a
// K-256 or P-256 public key, in its canonical form.
func checkRecoveryKey(raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	pub, err := atcrypto.ParsePublicDIDKey(raw)
	if err != nil || pub.DIDKey() != raw {
		return "", ruleErr(ErrInvalidRecoveryKey, "recoveryKey %.120q is not a did:key of a K-256 or P-256 public key", raw)
	}
	return raw, nil
}

func normalizeEmail(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return "", ruleErr(ErrInvalidEmail, "email is required")
	}
	a, err := mail.ParseAddress(raw)
	if err != nil || a.Address != raw || !strings.Contains(raw, "@") || len(raw) > 254 {
		return "", ruleErr(ErrInvalidEmail, "%q is not a valid email address", raw)
	}
	return strings.ToLower(raw), nil
}

// newAccount is a checked CreateInput with what the account's transaction
// stores.
type newAccount struct {
	handle syntax.Handle
	email  string
	invite string
	pwHash string
	key    *atcrypto.PrivateKeyK256
	sealed []byte
	// recovery is the holder's own rotation key (CreateInput.RecoveryKey).
	recovery string
}

// CreateAccount creates an account with a new did:plc, its empty
// repository, and a session.
//
// Order of events: everything that can be checked locally is checked
// first; then one transaction inserts the account (the unique indexes
// settle races on handle and email), uses the invite, writes the genesis
// commit and the #identity, #account and #sync events, and the session;
// the PLC genesis is submitted while that transaction is still open, and
// the transaction commits only if the directory accepted it. A PLC failure
// therefore leaves nothing behind. The reverse failure (PLC accepted, then
// the commit failed) leaves a DID pointing here with no account: it is
// logged and tombstoned on a best-effort basis.
func (s *Service) CreateAccount(ctx context.Context, in CreateInput) (*Account, *Session, error) {
	if in.PLCOp != nil {
		return s.createWithOp(ctx, in)
	}
	if in.DID != "" {
		return s.createImported(ctx, in)
	}
	na, err := s.prepareNew(ctx, in, "")
	if err != nil {
		return nil, nil, err
	}
	pub, err := na.key.PublicKey()
	if err != nil {
		return nil, nil, err
	}
	did, genesis, err := s.plc.Genesis(plc.Identity{Handle: na.handle, SigningKey: pub, PDSEndpoint: s.cfg.PublicURL, RecoveryKey: na.recovery})
	if err != nil {
		return nil, nil, err
	}
	if na.sealed, err = s.keys.seal(did, na.key); err != nil {
		return nil, nil, err
	}
	log := s.log.With("did", did, "handle", na.handle)

	var sess *Session
	submitted := false
	err = s.withPLCSlot(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var head *repo.Head
			var err error
			if head, sess, err = s.storeNew(ctx, tx, did, na); err != nil {
				return err
			}
			if err := auditCreation(ctx, tx, in.Audit, did, na, StatusActive); err != nil {
				return err
			}
			if err := s.plc.Submit(ctx, did, genesis); err != nil {
				return err
			}
			submitted = true
			log.Debug("plc genesis accepted", "rev", head.Rev)
			return nil
		})
	})
	if err != nil {
		if submitted {
			log.Error("account not stored after its DID was created in the PLC directory; tombstoning the DID", "error", err)
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), plc.DefaultTimeout)
			defer cancel()
			if terr := s.plc.Tombstone(tctx, did, genesis); terr != nil {
				log.Error("could not tombstone orphaned DID", "error", terr)
			}
		}
		return nil, nil, err
	}
	s.keys.remember(did, na.key)
	s.wake()
	log.Info("account created")
	return &Account{DID: did, Handle: na.handle, Email: na.email, Status: StatusActive, CreatedAt: time.Now()}, sess, nil
}

// prepareNew checks in (checkNew), hashes its password and makes the
// account's signing key: the one reserveSigningKey promised reservedFor
// (an existing DID, or the key that signed a genesis operation), or a
// fresh one when reservedFor is empty. That is everything a new account
// needs before its transaction.
func (s *Service) prepareNew(ctx context.Context, in CreateInput, reservedFor syntax.DID) (*newAccount, error) {
	na, err := s.checkNew(ctx, in)
	if err != nil {
		return nil, err
	}
	if na.pwHash, err = s.hash.hash(ctx, in.Password); err != nil {
		return nil, err
	}
	if reservedFor != "" {
		na.key, err = s.keys.reserved(reservedFor)
	} else {
		na.key, err = atcrypto.GeneratePrivateKeyK256()
	}
	if err != nil {
		return nil, err
	}
	return na, nil
}

// checkNew checks everything about in that can be checked before the
// account's transaction: the rules, and whether the handle or the email is
// taken already (the unique indexes still settle a race). A handle or
// email held by in.DID's own account does not count: that account is
// replaced (createImported). With an existing DID, a handle outside the
// server's domains is accepted when it resolves to that DID now
// (CheckHandle through in.Handles), as the reference PDS accepts it.
func (s *Service) checkNew(ctx context.Context, in CreateInput) (*newAccount, error) {
	var handle syntax.Handle
	var err error
	if in.DID != "" {
		handle, err = s.CheckHandle(ctx, in.Handle, syntax.DID(in.DID), in.Handles)
	} else {
		handle, err = s.NormalizeHandle(in.Handle)
	}
	if err != nil {
		return nil, err
	}
	email, err := normalizeEmail(in.Email)
	if err != nil {
		return nil, err
	}
	if err := checkNewPassword(in.Password); err != nil {
		return nil, err
	}
	recovery, err := checkRecoveryKey(strings.TrimSpace(in.RecoveryKey))
	if err != nil {
		return nil, err
	}
	invite := strings.TrimSpace(in.InviteCode)
	if s.cfg.InviteRequired && invite == "" {
		return nil, ruleErr(ErrInvalidInviteCode, "an invite code is required to create an account here")
	}
	var handleTaken, emailTaken bool
	if err := s.pool.QueryRow(ctx, qHandleOrEmailTaken, handle.String(), email, in.DID).Scan(&handleTaken, &emailTaken); err != nil {
		return nil, fmt.Errorf("checking handle: %w", db.Translate(err))
	}
	if handleTaken {
		return nil, ruleErr(ErrHandleNotAvailable, "handle %s is already taken", handle)
	}
	if emailTaken {
		return nil, ruleErr(ErrEmailTaken, "email %s is already used by another account", email)
	}
	return &newAccount{handle: handle, email: email, invite: invite, recovery: recovery}, nil
}

// storeNew writes a new account inside tx (a pgx.Tx: the repository
// engine makes the genesis commit in it): its row, the invite's use, the
// genesis commit, the #identity, #account and #sync events, and a session.
func (s *Service) storeNew(ctx context.Context, tx pgx.Tx, did syntax.DID, na *newAccount) (*repo.Head, *Session, error) {
	if _, err := tx.Exec(ctx, qInsertAccount, did.String(), na.handle.String(), na.email, na.pwHash, na.sealed); err != nil {
		return nil, nil, uniqueViolation(err, na.handle, na.email)
	}
	if na.invite != "" {
		if err := useInvite(ctx, tx, na.invite, did); err != nil {
			return nil, nil, err
		}
	}
	head, err := s.repo.InitRepo(ctx, tx, did, na.key)
	if err != nil {
		return nil, nil, err
	}
	if err := appendIdentity(ctx, tx, did, na.handle); err != nil {
		return nil, nil, err
	}
	if err := appendAccount(ctx, tx, did, StatusActive); err != nil {
		return nil, nil, err
	}
	ev, err := s.repo.SyncEvent(ctx, tx, did)
	if err != nil {
		return nil, nil, err
	}
	if err := eventlog.Append(ctx, tx, ev); err != nil {
		return nil, nil, err
	}
	sess, err := s.newSession(ctx, tx, did, nil)
	return head, sess, err
}

// uniqueViolation turns a unique-index failure on insert into the error
// naming what is taken.
func uniqueViolation(err error, handle syntax.Handle, email string) error {
	err = db.Translate(err)
	if !errors.Is(err, db.ErrConflict) {
		return fmt.Errorf("storing account: %w", err)
	}
	if strings.HasSuffix(db.ConstraintName(err), "pkey") {
		return ruleErr(ErrAccountExists, "this DID already has an account here")
	}
	if strings.Contains(db.ConstraintName(err), "email") {
		return ruleErr(ErrEmailTaken, "email %s is already used by another account", email)
	}
	return ruleErr(ErrHandleNotAvailable, "handle %s is already taken", handle)
}

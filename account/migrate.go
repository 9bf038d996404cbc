package account

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/replay"
)

// Moving an account between servers (goat's `account migrate`): the new
// server creates the account deactivated for an existing DID
// (createImported), the old server signs the PLC operation that points the
// DID at the new one (SignPLCOperation), the new server checks and submits
// it (SubmitPLCOperation) and activates the account (Activate).

//go:embed migrate.sql
var migrateSQL string

var (
	migrateQueries         = db.MustParseQueries(migrateSQL)
	qInsertImportedAccount = migrateQueries.MustGet("InsertImportedAccount")
	qLockMoveState         = migrateQueries.MustGet("LockMoveState")
	qMarkMovedAway         = migrateQueries.MustGet("MarkMovedAway")
)

// Migration errors. The pds package maps each to an XRPC error.
var (
	// ErrAccountExists means the DID already has an account here that
	// cannot be replaced: any account not recorded as moved away (active,
	// taken down, created here for a move still in progress), or one whose
	// DID document names this server again.
	ErrAccountExists = errors.New("account already exists")
	// ErrIncompatibleDIDDoc means the DID document does not make this
	// server the account's PDS: its endpoint, signing key or rotation keys
	// differ. The wrapping message says which.
	ErrIncompatibleDIDDoc = errors.New("DID document does not match this server")
	// ErrInvalidPLCOperation means a PLC operation submitted for an account
	// would not keep it hosted here: this server's rotation key dropped,
	// atproto_pds elsewhere, another signing key, or the handle not first
	// in alsoKnownAs. Nothing was sent to the directory.
	ErrInvalidPLCOperation = errors.New("invalid PLC operation")
)

// createImported creates the account of a DID another server hosts
// (CreateInput.DID, a did:plc or a did:web): the caller has checked that
// the requester controls the DID with the service-auth JWT in.ServiceAuth
// describes, which is recorded as used in the account's transaction
// (ErrServiceAuthReplayed if it was used before). The account starts
// deactivated, with the signing key reserved for the DID, an empty
// repository and a session; nothing is sent to the PLC directory and no
// event is emitted, since the DID document still names the old server
// until the user changes it (submitPlcOperation, or a did:web's own
// did.json), and Activate announces the account. Invite rules apply as
// for any account.
//
// An account of the same DID recorded as moved away (Deactivate) whose
// document still names another server is replaced in the same
// transaction; any other account of the DID is ErrAccountExists, notably
// one created here for a move still in progress.
func (s *Service) createImported(ctx context.Context, in CreateInput) (*Account, *Session, error) {
	did, err := supportedDID(strings.TrimSpace(in.DID))
	if err != nil {
		return nil, nil, err
	}
	if did.Method() == "web" && in.DIDs == nil {
		return nil, nil, ruleErr(ErrUnsupportedDID, "a did:web cannot be brought to this server")
	}
	in.DID = did.String()
	if in.ServiceAuth == nil || in.ServiceAuth.Issuer != did.String() {
		return nil, nil, fmt.Errorf("account: creating %s needs the service-auth JWT it issued", did)
	}
	na, err := s.prepareNew(ctx, in, did)
	if err != nil {
		return nil, nil, err
	}
	var sess *Session
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := replay.Record(ctx, tx, *in.ServiceAuth, s.cfg.Now()); err != nil {
			return err
		}
		var err error
		sess, err = s.storeImported(ctx, tx, did, na, in)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return s.imported(did, na), sess, nil
}

// storeImported writes, inside tx, the deactivated account of did, an
// existing DID moving here: it replaces an account left by an earlier
// move away (replaceStale), inserts the row, spends the invite, makes the
// empty repository, audits and opens a session.
func (s *Service) storeImported(ctx context.Context, tx pgx.Tx, did syntax.DID, na *newAccount, in CreateInput) (*Session, error) {
	var err error
	if na.sealed, err = s.keys.seal(did, na.key); err != nil {
		return nil, err
	}
	if err := s.replaceStale(ctx, tx, did, in.DIDs); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, qInsertImportedAccount, did.String(), na.handle.String(), na.email, na.pwHash, na.sealed); err != nil {
		if strings.HasSuffix(db.ConstraintName(err), "pkey") {
			return nil, ruleErr(ErrAccountExists, "%s already has an account here", did)
		}
		return nil, uniqueViolation(err, na.handle, na.email)
	}
	if na.invite != "" {
		if err := useInvite(ctx, tx, na.invite, did); err != nil {
			return nil, err
		}
	}
	if _, err := s.repo.InitRepo(ctx, tx, did, na.key); err != nil {
		return nil, err
	}
	if err := auditCreation(ctx, tx, in.Audit, did, na, StatusDeactivated); err != nil {
		return nil, err
	}
	return s.newSession(ctx, tx, did, nil)
}

// imported is the account storeImported wrote, once committed.
func (s *Service) imported(did syntax.DID, na *newAccount) *Account {
	s.keys.remember(did, na.key)
	s.log.Info("account created for an existing DID, deactivated until it moves here", "did", did, "handle", na.handle)
	return &Account{DID: did, Handle: na.handle, Email: na.email, Status: StatusDeactivated, CreatedAt: time.Now()}
}

// replaceStale deletes did's account here, inside tx, when it is one left
// behind by an earlier move away: recorded as moved away (Deactivate), and
// the DID document (read now; a did:web's through docs) still names
// another server. No account is fine; any other is ErrAccountExists.
func (s *Service) replaceStale(ctx context.Context, tx pgx.Tx, did syntax.DID, docs DocResolver) error {
	var status string
	var movedAway *time.Time
	err := db.Translate(tx.QueryRow(ctx, qLockMoveState, did.String()).Scan(&status, &movedAway))
	if errors.Is(err, db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if Status(status) != StatusDeactivated {
		return ruleErr(ErrAccountExists, "%s already has an account here (%s)", did, status)
	}
	if movedAway == nil {
		return ruleErr(ErrAccountExists, "%s already has a deactivated account here that did not move away "+
			"(a move here in progress, or deactivated by its owner): sign in with its password and go on with it", did)
	}
	h, err := s.currentHosting(ctx, did, docs)
	if err != nil {
		return err
	}
	if h.endpoint == s.cfg.PublicURL {
		return ruleErr(ErrAccountExists, "%s already has a deactivated account here, and its DID document names this server: sign in and activate it", did)
	}
	if err := s.deleteRows(ctx, tx, did); err != nil {
		return err
	}
	s.log.Info("replacing the account left here by an earlier move away", "did", did, "moved_away_at", movedAway)
	return nil
}

// Deactivate is com.atproto.server.deactivateAccount: did's account
// becomes deactivated, with #account. When it was active and its DID
// document (read now: a did:plc's last operation, a did:web's document
// through docs) names another server (the last step of a move away,
// after the new server took the DID), it is recorded as moved away: a
// later createAccount bringing the DID back here may then replace it. A
// document that cannot be read records nothing; the deactivation goes
// on. A taken-down account stays taken down (deactivating is the last
// step of moving away, which such an account may take, and must not lift
// the takedown, whatever happened since the caller was authorised).
func (s *Service) Deactivate(ctx context.Context, did syntax.DID, docs DocResolver) error {
	elsewhere := false
	h, err := s.currentHosting(ctx, did, docs)
	if err != nil {
		s.log.Warn("deactivating without reading the DID document: not recorded as moved away", "did", did, "error", err)
	} else {
		elsewhere = h.endpoint != s.cfg.PublicURL
	}
	deactivate := func(from Status) Status {
		if from == StatusTakendown {
			return from
		}
		return StatusDeactivated
	}
	return s.setStatus(ctx, did, deactivate, func(ctx context.Context, tx db.DBTX, from, to Status) error {
		if from != StatusActive || to != StatusDeactivated || !elsewhere {
			return nil
		}
		if _, err := tx.Exec(ctx, qMarkMovedAway, did.String(), s.cfg.Now()); err != nil {
			return db.Translate(err)
		}
		s.log.Info("account moved away", "did", did, "endpoint", h.endpoint)
		return nil
	}, nil)
}

// Activate makes did's account active and announces it in one
// transaction: #identity, #account (active) and a #sync of the current
// commit, in that order. It does so also when the account was active
// already, as the reference PDS does: activateAccount is what a client
// calls at the end of a move, and the events make relays fetch the
// account afresh. A taken-down account stays taken down.
func (s *Service) Activate(ctx context.Context, did syntax.DID) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		handle, from, err := lockAccount(ctx, tx, did)
		if err != nil {
			return err
		}
		if from == StatusTakendown {
			return ErrAccountTakendown
		}
		return s.storeStatus(ctx, tx, did, handle, StatusActive)
	})
	if err != nil {
		return err
	}
	s.wake()
	s.log.Info("account activated", "did", did)
	return nil
}

// mailTokens checks the codes requestPlcOperationSignature mails.
func (s *Service) mailTokens() email.Tokens { return email.Tokens{Now: s.cfg.Now} }

// SignPLCOperation signs, for com.atproto.identity.signPlcOperation, the
// operation that follows did's current one with o applied, and returns it
// unsent: the account's next server submits it. token is the code
// requestPlcOperationSignature mailed (purpose plc_operation); it is used
// up only if the operation is signed (email.ErrTokenInvalid or
// email.ErrTokenExpired otherwise). This server's rotation key must be
// among the DID's current rotation keys (else plc.ErrNotControlled); a DID
// that is not a did:plc is ErrNotPLC.
func (s *Service) SignPLCOperation(ctx context.Context, did syntax.DID, token string, o plc.Overrides) (*didplc.RegularOp, error) {
	if err := requirePLC(did); err != nil {
		return nil, err
	}
	var op *didplc.RegularOp
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.mailTokens().Consume(ctx, tx, did, email.PurposePLCOperation, token); err != nil {
			return err
		}
		var err error
		op, err = s.plc.SignUpdate(ctx, did, o)
		return err
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("plc operation signed", "did", did, "endpoint", op.Services[plc.ServiceID].Endpoint)
	return op, nil
}

// SubmitPLCOperation checks op, an operation for did signed elsewhere
// (com.atproto.identity.submitPlcOperation), submits it to the PLC
// directory and emits #identity, under the account's lock. op must keep
// the account hosted here (else ErrInvalidPLCOperation, and nothing is
// sent): this server's rotation key among its rotation keys, atproto_pds
// at this server's URL, the account's signing key as atproto, and at://
// the account's handle first in alsoKnownAs. A malformed op is
// plc.ErrInvalidOperation; one the directory refuses is plc.ErrRejected; a
// DID that is not a did:plc is ErrNotPLC.
func (s *Service) SubmitPLCOperation(ctx context.Context, did syntax.DID, op *didplc.RegularOp) error {
	if err := requirePLC(did); err != nil {
		return err
	}
	if err := plc.CheckOperation(op); err != nil {
		return err
	}
	pub, err := s.PublicKey(ctx, did)
	if err != nil {
		return err
	}
	err = s.withPLCSlot(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			handle, _, err := lockAccount(ctx, tx, did)
			if err != nil {
				return err
			}
			if err := s.checkHostedHere(op, pub, handle); err != nil {
				return err
			}
			if err := s.plc.Submit(ctx, did, op); err != nil {
				return err
			}
			return appendIdentity(ctx, tx, did, handle)
		})
	})
	if err != nil {
		return err
	}
	s.wake()
	s.log.Info("plc operation submitted", "did", did)
	return nil
}

// checkHostedHere applies submitPlcOperation's rules (the reference PDS's)
// to op for an account with signing key pub and handle.
func (s *Service) checkHostedHere(op *didplc.RegularOp, pub atcrypto.PublicKey, handle syntax.Handle) error {
	svc, ok := op.Services[plc.ServiceID]
	switch {
	case !s.plc.Controls(op):
		return ruleErr(ErrInvalidPLCOperation, "the operation's rotation keys do not include this server's rotation key (%s)", s.plc.RotationKey())
	case !ok || svc.Type != plc.ServiceType:
		return ruleErr(ErrInvalidPLCOperation, "the operation's atproto_pds service must have type %s", plc.ServiceType)
	case svc.Endpoint != s.cfg.PublicURL:
		return ruleErr(ErrInvalidPLCOperation, "the operation's atproto_pds endpoint must be this server (%s), not %.200q", s.cfg.PublicURL, svc.Endpoint)
	case op.VerificationMethods[plc.VerificationMethod] != pub.DIDKey():
		return ruleErr(ErrInvalidPLCOperation, "the operation's atproto verification method must be the account's signing key here (%s)", pub.DIDKey())
	case len(op.AlsoKnownAs) == 0 || op.AlsoKnownAs[0] != "at://"+handle.String():
		return ruleErr(ErrInvalidPLCOperation, "the operation's alsoKnownAs must start with at://%s", handle)
	}
	return nil
}

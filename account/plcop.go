package account

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/plc"
)

// createAccount with a plcOp: a PLC operation the account holder signed
// with a rotation key of their own, which makes this server the DID's
// PDS. The reference PDS takes one only on an entryway (which signs it
// itself); here the holder signs it, so the operation is what proves they
// control the DID, and it must be one the directory will take: a genesis
// (a new did:plc), or the update that follows the DID's current operation.

// ErrIncompatiblePLCOp means createAccount's plcOp does not make this
// server the account's PDS, or is not a valid operation the holder
// signed: the reference PDS's IncompatibleDidDoc. Nothing was stored or
// sent to the directory.
var ErrIncompatiblePLCOp = errors.New("incompatible PLC operation")

// opCheck is a plcOp that passed checkOp.
type opCheck struct {
	did syntax.DID
	// reservedFor is the DID whose reserved key signs the repository:
	// the DID itself for an update, the did:key that signed a genesis.
	reservedFor syntax.DID
}

// checkOp checks in.PLCOp, as the reference PDS's entryway checks its
// plcOp, except for who signed it: a well-formed operation, this server's
// rotation key among its rotation keys, signed by one of its own rotation
// keys (a genesis, whose DID must be in.DID when that is given) or by one
// of the DID's current ones, following its current operation (an
// update). The handle, the pds endpoint and the signing key are checked
// by checkOpContents.
func (s *Service) checkOp(ctx context.Context, in CreateInput) (*opCheck, error) {
	op := in.PLCOp
	if err := plc.CheckSigned(op); err != nil {
		return nil, ruleErr(ErrIncompatiblePLCOp, "%v", err)
	}
	if !s.plc.Controls(op) {
		return nil, ruleErr(ErrIncompatiblePLCOp, "PLC DID does not include service rotation key (%s)", s.plc.RotationKey())
	}
	if op.IsGenesis() {
		raw, err := op.DID()
		if err != nil {
			return nil, ruleErr(ErrIncompatiblePLCOp, "invalid plc operation: %v", err)
		}
		did := syntax.DID(raw)
		if in.DID != "" && in.DID != raw {
			return nil, ruleErr(ErrIncompatiblePLCOp, "the genesis operation makes %s, not %.100s", did, in.DID)
		}
		i, err := didplc.VerifySignatureAny(op, op.RotationKeys)
		if err != nil {
			return nil, ruleErr(ErrIncompatiblePLCOp, "invalid plc operation: its signature is not by one of its rotation keys")
		}
		signer, err := syntax.ParseDID(op.RotationKeys[i])
		if err != nil {
			return nil, ruleErr(ErrIncompatiblePLCOp, "invalid plc operation: rotation key %.100q", op.RotationKeys[i])
		}
		return &opCheck{did: did, reservedFor: signer}, nil
	}
	if in.DID == "" {
		return nil, ruleErr(ErrIncompatiblePLCOp, "an update operation needs the did it updates")
	}
	did, err := syntax.ParseDID(in.DID)
	if err != nil || did.Method() != "plc" {
		return nil, ruleErr(ErrIncompatiblePLCOp, "a PLC operation updates a did:plc, not %.100q", in.DID)
	}
	cur, head, err := s.plc.Last(ctx, did)
	if errors.Is(err, plc.ErrTombstoned) {
		return nil, ruleErr(ErrIncompatiblePLCOp, "%s is tombstoned", did)
	}
	if err != nil {
		return nil, err
	}
	if *op.Prev != head {
		// Also an operation already in the log (its prev is older), so a
		// published operation cannot be brought by someone else.
		return nil, ruleErr(ErrIncompatiblePLCOp, "the operation must follow the current operation of %s (prev %s)", did, head)
	}
	if _, err := didplc.VerifySignatureAny(op, cur.RotationKeys); err != nil {
		return nil, ruleErr(ErrIncompatiblePLCOp, "invalid plc operation: it is not signed by a current rotation key of %s", did)
	}
	return &opCheck{did: did, reservedFor: did}, nil
}

// checkOpContents checks what the operation says against the account
// asked for: rawHandle first in alsoKnownAs, the atproto_pds service at
// this server's URL, and as atproto the key reserved for reservedFor (the
// reference PDS's validateAtprotoData, with its messages). It runs before
// the handle is resolved or the password hashed, so an operation that
// cannot be taken costs neither.
func (s *Service) checkOpContents(op *didplc.RegularOp, rawHandle string, reservedFor syntax.DID) error {
	key, err := s.keys.reserved(reservedFor)
	if err != nil {
		return err
	}
	signingKey, err := didKeyOf(key)
	if err != nil {
		return err
	}
	handle, err := syntax.ParseHandle(strings.TrimSpace(rawHandle))
	if err != nil {
		return ruleErr(ErrInvalidHandle, "invalid handle %.100q: %v", rawHandle, err)
	}
	svc, ok := op.Services[plc.ServiceID]
	switch {
	case firstHandle(op.AlsoKnownAs) != handle.Normalize():
		return ruleErr(ErrIncompatiblePLCOp, "provided handle does not match DID document handle: the operation's alsoKnownAs must start with at://%s", handle.Normalize())
	case !ok || svc.Type != plc.ServiceType || svc.Endpoint != s.cfg.PublicURL:
		return ruleErr(ErrIncompatiblePLCOp, "DID document pds endpoint does not match service endpoint: atproto_pds must be a %s at %s", plc.ServiceType, s.cfg.PublicURL)
	case op.VerificationMethods[plc.VerificationMethod] != signingKey:
		return ruleErr(ErrIncompatiblePLCOp, "DID document signing key does not match service signing key: atproto must be %s "+
			"(com.atproto.server.reserveSigningKey with the did, or for a genesis the did:key that signs it)", signingKey)
	}
	return nil
}

// createWithOp is createAccount with in.PLCOp. After checkOp,
// checkOpContents and checkNew's rules, one transaction stores the
// account and submits the operation; it commits only if the directory
// took it. A genesis makes an active account with its events, as any new
// account; an update (a move here, the old server out of the loop) a
// deactivated one, as a move with a service-auth JWT does, which its
// owner fills (importRepo) and activates. A directory failure leaves
// nothing behind; a genesis the directory took whose account was then not
// stored is tombstoned.
func (s *Service) createWithOp(ctx context.Context, in CreateInput) (*Account, *Session, error) {
	oc, err := s.checkOp(ctx, in)
	if err != nil {
		return nil, nil, err
	}
	if err := s.checkOpContents(in.PLCOp, in.Handle, oc.reservedFor); err != nil {
		return nil, nil, err
	}
	in.DID = oc.did.String()
	na, err := s.prepareNew(ctx, in, oc.reservedFor)
	if err != nil {
		return nil, nil, err
	}
	genesis := in.PLCOp.IsGenesis()
	log := s.log.With("did", oc.did, "handle", na.handle)
	var sess *Session
	submitted := false
	err = s.withPLCSlot(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var err error
			if genesis {
				if na.sealed, err = s.keys.seal(oc.did, na.key); err != nil {
					return err
				}
				if _, sess, err = s.storeNew(ctx, tx, oc.did, na); err != nil {
					return err
				}
				err = auditCreation(ctx, tx, in.Audit, oc.did, na, StatusActive)
			} else {
				sess, err = s.storeImported(ctx, tx, oc.did, na, in)
			}
			if err != nil {
				return err
			}
			if err := s.plc.Submit(ctx, oc.did, in.PLCOp); err != nil {
				return err
			}
			submitted = true
			return nil
		})
	})
	if err != nil {
		if submitted {
			s.undoSubmitted(ctx, log, oc.did, in.PLCOp, err)
		}
		return nil, nil, err
	}
	if !genesis {
		return s.imported(oc.did, na), sess, nil
	}
	s.keys.remember(oc.did, na.key)
	s.wake()
	log.Info("account created with the holder's genesis operation")
	return &Account{DID: oc.did, Handle: na.handle, Email: na.email, Status: StatusActive, CreatedAt: time.Now()}, sess, nil
}

// undoSubmitted cleans up after the directory took op but its account was
// not stored (cause): a genesis is tombstoned (this server's rotation key
// is among its rotation keys); an update cannot be taken back, and is
// logged: the DID names this server without an account here, which a
// createAccount with a service-auth JWT of the DID can still make.
func (s *Service) undoSubmitted(ctx context.Context, log *slog.Logger, did syntax.DID, op *didplc.RegularOp, cause error) {
	if !op.IsGenesis() {
		log.Error("the PLC directory took the operation but the account was not stored", "error", cause)
		return
	}
	log.Error("account not stored after its genesis was accepted by the PLC directory; tombstoning the DID", "error", cause)
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), plc.DefaultTimeout)
	defer cancel()
	if err := s.plc.Tombstone(tctx, did, op); err != nil {
		log.Error("could not tombstone orphaned DID", "error", fmt.Errorf("tombstone: %w", err))
	}
}

package account

import (
	"context"
	"errors"
	"fmt"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
)

// The account lifecycle: handle changes, status changes and deletion, each
// with the firehose events that tell consumers about it.

// UpdateHandle changes did's handle: for a did:plc, the PLC document
// first (inside the transaction, so a directory failure changes nothing);
// then the row and an #identity event. A did:web's document is its
// owner's: it must name the new handle first already (read now through
// the DocResolver ResolveDIDsWith gives; ErrIncompatibleDIDDoc
// otherwise). A handle outside the server's domains needs
// ResolveHandlesWith among opts, and is checked (CheckHandle) before
// anything is locked.
func (s *Service) UpdateHandle(ctx context.Context, did syntax.DID, raw string, opts ...WriteOption) (syntax.Handle, error) {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	handle, err := s.checkHandle(ctx, raw, did, o.resolver, o.anyHandle)
	if err != nil {
		return "", err
	}
	if did.Method() != "plc" {
		if err := s.checkDeclaredHandle(ctx, did, handle, o.docs); err != nil {
			return "", err
		}
	}
	submitted := false
	err = s.withPLCSlot(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			cur, _, err := lockAccount(ctx, tx, did)
			if err != nil {
				return err
			}
			if cur != handle {
				if _, err := tx.Exec(ctx, qSetHandle, did.String(), handle.String()); err != nil {
					return uniqueViolation(err, handle, "")
				}
				if did.Method() == "plc" {
					if err := s.plc.UpdateHandle(ctx, did, handle); err != nil {
						return err
					}
					submitted = true
				}
			}
			// An unchanged handle still emits #identity: clients call
			// updateHandle to make relays re-verify a handle.
			if err := appendIdentity(ctx, tx, did, handle); err != nil {
				return err
			}
			return runAlso(ctx, tx, opts)
		})
	})
	if err != nil {
		if submitted {
			// Rare (the commit failed after the directory accepted): the
			// DID document names the new handle, this database the old
			// one. Calling updateHandle again with the new handle repairs it.
			s.log.Error("handle changed in the PLC directory but not stored", "did", did, "handle", handle, "error", err)
		}
		return "", err
	}
	s.wake()
	s.log.Info("handle updated", "did", did, "handle", handle)
	return handle, nil
}

// checkDeclaredHandle checks that the DID document of did, a did:web,
// names handle first in alsoKnownAs now, as the reference PDS requires
// before it takes a did:web's new handle.
func (s *Service) checkDeclaredHandle(ctx context.Context, did syntax.DID, handle syntax.Handle, docs DocResolver) error {
	h, err := s.currentHosting(ctx, did, docs)
	if err != nil {
		return err
	}
	if h.handle != handle {
		return ruleErr(ErrIncompatibleDIDDoc, "DID is not properly configured for handle: the document of %s must list at://%s first in alsoKnownAs", did, handle)
	}
	return nil
}

// SetStatus moves did between active, deactivated and takendown, and
// emits #account (plus #identity and #sync on reactivation, so consumers
// re-fetch what they may have dropped, as the reference PDS does).
func (s *Service) SetStatus(ctx context.Context, did syntax.DID, to Status, opts ...WriteOption) error {
	if to != StatusActive && to != StatusDeactivated && to != StatusTakendown {
		return fmt.Errorf("account: cannot set status %q", to)
	}
	return s.setStatus(ctx, did, func(Status) Status { return to }, nil, opts)
}

// statusChange is work done in a status change's transaction, knowing the
// status before and after.
type statusChange func(ctx context.Context, tx db.DBTX, from, to Status) error

// setStatus is SetStatus with the new status chosen by next from the
// current one, under the account's lock; then (when not nil) runs in the
// transaction after the change, before opts, even when nothing changed.
func (s *Service) setStatus(ctx context.Context, did syntax.DID, next func(Status) Status, then statusChange, opts []WriteOption) error {
	var to Status
	changed := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		handle, from, err := lockAccount(ctx, tx, did)
		if err != nil {
			return err
		}
		to = next(from)
		if from != to {
			if err := s.storeStatus(ctx, tx, did, handle, to); err != nil {
				return err
			}
			changed = true
		}
		if then != nil {
			if err := then(ctx, tx, from, to); err != nil {
				return err
			}
		}
		return runAlso(ctx, tx, opts)
	})
	if err != nil {
		return err
	}
	if changed {
		s.wake()
		s.log.Info("account status changed", "did", did, "status", to)
	}
	return nil
}

// storeStatus stores did's new status and appends its events inside tx.
func (s *Service) storeStatus(ctx context.Context, tx db.DBTX, did syntax.DID, handle syntax.Handle, to Status) error {
	if _, err := tx.Exec(ctx, qSetStatus, did.String(), string(to)); err != nil {
		return db.Translate(err)
	}
	if to == StatusActive {
		if err := appendIdentity(ctx, tx, did, handle); err != nil {
			return err
		}
	}
	if err := appendAccount(ctx, tx, did, to); err != nil {
		return err
	}
	if to != StatusActive {
		return nil
	}
	ev, err := s.repo.SyncEvent(ctx, tx, did)
	if err != nil {
		return err
	}
	return eventlog.Append(ctx, tx, ev)
}

// Delete removes did's account and repository for good, emitting #account
// with status deleted. Earlier events of the account stay in the log until
// they age out, as on any PDS; the #account event tells consumers to drop
// them.
func (s *Service) Delete(ctx context.Context, did syntax.DID, opts ...WriteOption) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, _, err := lockAccount(ctx, tx, did); err != nil {
			return err
		}
		if err := runFirst(ctx, tx, opts); err != nil {
			return err
		}
		if err := s.deleteRows(ctx, tx, did); err != nil {
			return err
		}
		if err := appendAccount(ctx, tx, did, StatusDeleted); err != nil {
			return err
		}
		return runAlso(ctx, tx, opts)
	})
	if err != nil {
		return err
	}
	s.keys.forget(did)
	s.wake()
	s.log.Info("account deleted", "did", did)
	return nil
}

// deleteRows deletes did's account, repository and what other packages
// keep for it (Cleaners) inside tx, which holds the account's lock.
func (s *Service) deleteRows(ctx context.Context, tx db.DBTX, did syntax.DID) error {
	// The repo row is locked first, as writers lock it, so a commit in
	// flight finishes before its rows are deleted.
	if _, err := tx.Exec(ctx, qLockRepoRoot, did.String()); err != nil {
		return db.Translate(err)
	}
	for _, c := range s.cfg.Cleaners {
		if err := c.DeleteAccountTx(ctx, tx, did); err != nil {
			return fmt.Errorf("deleting account: %w", err)
		}
	}
	if err := s.cfg.Repo.DeleteRepoTx(ctx, tx, did); err != nil {
		return fmt.Errorf("deleting account: %w", err)
	}
	if _, err := tx.Exec(ctx, qDeleteAccount, did.String()); err != nil {
		return fmt.Errorf("deleting account: %w", db.Translate(err))
	}
	return nil
}

// lockAccount locks did's account row until tx ends and returns its handle
// and status. Changes to an account take this lock first, so they apply
// one at a time.
func lockAccount(ctx context.Context, tx db.DBTX, did syntax.DID) (syntax.Handle, Status, error) {
	var handle, status, pw string
	err := db.Translate(tx.QueryRow(ctx, qLockAccount, did.String()).Scan(&handle, &status, &pw))
	if errors.Is(err, db.ErrNotFound) {
		return "", "", ErrAccountNotFound
	}
	if err != nil {
		return "", "", err
	}
	return syntax.Handle(handle), Status(status), nil
}

// appendIdentity appends did's #identity event inside tx.
func appendIdentity(ctx context.Context, tx db.DBTX, did syntax.DID, handle syntax.Handle) error {
	h := handle.String()
	ev, err := eventlog.EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{Did: did.String(), Handle: &h, Time: syntax.DatetimeNow().String()})
	if err != nil {
		return err
	}
	return eventlog.Append(ctx, tx, ev)
}

// appendAccount appends did's #account event, with status, inside tx.
func appendAccount(ctx context.Context, tx db.DBTX, did syntax.DID, status Status) error {
	ev := &comatproto.SyncSubscribeRepos_Account{Did: did.String(), Active: status == StatusActive, Time: syntax.DatetimeNow().String()}
	if status != StatusActive {
		st := string(status)
		ev.Status = &st
	}
	enc, err := eventlog.EncodeAccount(ev)
	if err != nil {
		return err
	}
	return eventlog.Append(ctx, tx, enc)
}

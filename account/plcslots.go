package account

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/budget"
)

// ErrDirectoryBusy means too many changes were waiting for the PLC
// directory: the change was refused before it started. Retrying shortly
// may succeed.
var ErrDirectoryBusy = errors.New("too many PLC directory updates in progress")

// Bounds on the transactions that wait for the PLC directory.
const (
	// plcSlotQueue is how many may wait for a slot.
	plcSlotQueue = 64
	// plcSlotWait is how long one waits for a slot at most.
	plcSlotWait = 10 * time.Second
)

// newPLCSlots bounds the transactions that hold a database connection
// while they wait for the PLC directory (a new account's genesis, a handle
// change, a PLC operation: each is submitted inside its transaction, so
// that a refusal leaves nothing behind) to a quarter of the pool, first
// come first served. Without the bound a burst of sign-ups, let through
// the password queue together, takes every connection for as long as the
// directory takes to answer, and everything else waits; with the
// development PLC, which stores operations through the same pool, the
// transactions wait for connections only they could give back.
func newPLCSlots(pool *pgxpool.Pool) *budget.Budget {
	slots := max(1, int64(pool.Config().MaxConns)/4)
	return budget.New(budget.Config{Capacity: slots, MaxQueue: plcSlotQueue, RetryAfter: time.Second})
}

// withPLCSlot runs fn, which opens a transaction and waits for the PLC
// directory inside it, in one of the slots.
func (s *Service) withPLCSlot(ctx context.Context, fn func() error) error {
	wctx, cancel := context.WithTimeout(ctx, plcSlotWait)
	res, err := s.plcSlots.Acquire(wctx, 1)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %v", ErrDirectoryBusy, err)
	}
	defer res.Release()
	return fn()
}

package account

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/budget"
)

var cheapParams = PasswordParams{Memory: 64, Time: 1, Threads: 1}

// queueTest is a hasher with one slot that the test holds, so that every
// check has to queue, and the order in which checks reached the hash.
type queueTest struct {
	t     *testing.T
	ctx   context.Context
	slots *budget.Budget
	h     *hasher
	held  *budget.Reservation
	enc   string

	mu     sync.Mutex
	hashed []string
}

func newQueueTest(t *testing.T, queue int, wait time.Duration) *queueTest {
	// The deadline only bounds a failing test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	q := &queueTest{t: t, ctx: ctx, slots: NewPasswordSlots(1, queue)}
	q.h = newHasher(cheapParams, q.slots, wait)
	enc, err := q.h.hash(ctx, "correct horse battery")
	require.NoError(t, err)
	q.enc = enc
	q.h.derive = func(pw, salt []byte, p PasswordParams) []byte {
		q.mu.Lock()
		q.hashed = append(q.hashed, string(pw))
		q.mu.Unlock()
		return argon2ID(pw, salt, p)
	}
	q.held, err = q.slots.Acquire(ctx, 1)
	require.NoError(t, err)
	return q
}

// check starts a verification of pw by client in the background and
// returns once it waits in the queue; the result arrives on the channel.
func (q *queueTest) check(client, pw string) <-chan error {
	q.t.Helper()
	before := q.slots.Stats().QueueLen
	done := make(chan error, 1)
	go func() {
		ctx := q.ctx
		if client != "" {
			ctx = WithClient(ctx, client)
		}
		_, err := q.h.verify(ctx, pw, q.enc)
		done <- err
	}()
	require.Eventually(q.t, func() bool { return q.slots.Stats().QueueLen == before+1 }, 30*time.Second, time.Millisecond,
		"the check of %q never queued", pw)
	return done
}

// TestHasherQueuesInOrder: with every slot taken, checks wait instead of
// failing, and are hashed in the order they came, each once a slot is
// free.
func TestHasherQueuesInOrder(t *testing.T) {
	t.Parallel()
	q := newQueueTest(t, 8, time.Minute)
	var waits []<-chan error
	var want []string
	for i := range 8 {
		pw := fmt.Sprintf("password %d", i)
		want = append(want, pw)
		waits = append(waits, q.check("", pw))
	}
	require.Empty(t, q.hashed, "nothing is hashed while the slot is held")
	q.held.Release()
	for _, w := range waits {
		require.NoError(t, <-w)
	}
	require.Equal(t, want, q.hashed)
	require.Zero(t, q.slots.Stats().Rejected)
}

// TestHasherRefusesWhenQueueFull: with the slot taken and the queue full,
// one more check fails at once with ErrPasswordBusy, having hashed
// nothing; those that queued are served once the slot is free.
func TestHasherRefusesWhenQueueFull(t *testing.T) {
	t.Parallel()
	q := newQueueTest(t, 2, time.Minute)
	first, second := q.check("", "correct horse battery"), q.check("", "wrong")
	_, err := q.h.verify(q.ctx, "one too many", q.enc)
	require.ErrorIs(t, err, ErrPasswordBusy)
	require.ErrorIs(t, q.h.dummyVerify(q.ctx, "x"), ErrPasswordBusy)
	_, err = q.h.hash(q.ctx, "a new password")
	require.ErrorIs(t, err, ErrPasswordBusy)
	q.held.Release()
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	require.Equal(t, []string{"correct horse battery", "wrong"}, q.hashed)
}

// TestHasherWaitRunsOut: a check that gets no slot within the wait fails
// with ErrPasswordBusy and leaves the queue; one whose client went away
// fails with the context's error instead.
func TestHasherWaitRunsOut(t *testing.T) {
	t.Parallel()
	q := newQueueTest(t, 8, time.Millisecond)
	_, err := q.h.verify(q.ctx, "correct horse battery", q.enc)
	require.ErrorIs(t, err, ErrPasswordBusy)
	require.Zero(t, q.slots.Stats().QueueLen)

	gone, cancel := context.WithCancel(q.ctx)
	cancel()
	_, err = q.h.verify(gone, "correct horse battery", q.enc)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, errors.Is(err, ErrPasswordBusy))
	require.Empty(t, q.hashed)
}

// TestHasherClientShare: one client holds at most half the places (slots
// and queue): past that its checks fail at once while another client's
// still queue, and its share comes back as its checks finish.
func TestHasherClientShare(t *testing.T) {
	t.Parallel()
	q := newQueueTest(t, 5, time.Minute) // 1 slot + 5 places: 3 each
	require.Equal(t, 3, q.h.share)
	var waits []<-chan error
	for i := range 3 {
		waits = append(waits, q.check("192.0.2.1", fmt.Sprintf("a%d", i)))
	}
	_, err := q.h.verify(WithClient(q.ctx, "192.0.2.1"), "a3", q.enc)
	require.ErrorIs(t, err, ErrPasswordBusy)
	waits = append(waits, q.check("192.0.2.2", "b0"))
	q.held.Release()
	for _, w := range waits {
		require.NoError(t, <-w)
	}
	require.Equal(t, []string{"a0", "a1", "a2", "b0"}, q.hashed)
	_, err = q.h.verify(WithClient(q.ctx, "192.0.2.1"), "a4", q.enc)
	require.NoError(t, err, "the share is given back")
	q.h.mu.Lock()
	require.Empty(t, q.h.held, "no client holds a place once its checks are done")
	q.h.mu.Unlock()
}

// Package priority lets background work give way to foreground work on a
// busy server: "writes first".
//
// A Gate counts the foreground work in flight (a user's createRecord, an
// upload). Background work that can go slower without anyone noticing (a
// scraper's 25 MB getRepo export, a blob download) calls Yield between
// chunks: with no foreground work in flight it returns at once; otherwise
// it waits until the foreground work is done, or for a bounded pause
// (MaxPause), whichever comes first. The bound means background work can
// be slowed but never starved: under a steady stream of writes it still
// makes one chunk of progress per MaxPause.
//
//	leave := gate.Enter() // foreground: around a write handler
//	defer leave()
//
//	for chunk := range chunks { // background: before each chunk
//		if err := gate.Yield(ctx); err != nil {
//			return err
//		}
//		write(chunk)
//	}
//
// Enter and leave are an atomic add each, plus a short critical section
// when the count crosses zero; Yield costs an atomic load when nothing is
// in flight. Waiters sleep on a channel that is closed when the count
// drops to zero, so they neither poll nor spin.
package priority

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxPause is the longest one Yield waits for foreground work to
// finish when Config.MaxPause is zero: about the time a write takes on a
// loaded server, so that a write in flight gets the CPU for most of its
// life while a stream still moves one chunk (64 KiB for a CAR export) per
// pause.
const DefaultMaxPause = 25 * time.Millisecond

// Config configures a Gate.
type Config struct {
	// MaxPause bounds each Yield. Zero means DefaultMaxPause; negative
	// means Yield never waits (foreground work is still counted).
	MaxPause time.Duration
	// OnPause, when set, is called after every Yield that waited, with
	// how long it waited and whether it stopped at MaxPause with
	// foreground work still in flight (rather than because the work was
	// done or the context ended). For metrics; it must be quick.
	OnPause func(paused time.Duration, timedOut bool)
}

// Gate counts foreground work in flight and holds background work back
// while there is some. The zero value is not usable; use New. A nil *Gate
// is: Enter counts nothing and Yield never waits.
type Gate struct {
	maxPause time.Duration
	onPause  func(time.Duration, bool)

	// active is the foreground work in flight.
	active atomic.Int64

	// mu guards idle, which is closed exactly when active is zero (up to
	// the moment between an Add and the reconcile that follows it). It is
	// replaced by a fresh channel when active rises from zero.
	mu   sync.Mutex
	idle chan struct{}

	// Statistics.
	entered  atomic.Uint64
	waiting  atomic.Int64
	waits    atomic.Uint64
	timeouts atomic.Uint64
	paused   atomic.Int64 // nanoseconds
}

// New returns a Gate with nothing in flight.
func New(cfg Config) *Gate {
	pause := cfg.MaxPause
	if pause == 0 {
		pause = DefaultMaxPause
	}
	idle := make(chan struct{})
	close(idle)
	return &Gate{maxPause: pause, onPause: cfg.OnPause, idle: idle}
}

// MaxPause is the bound of one Yield; zero or less means Yield never
// waits.
func (g *Gate) MaxPause() time.Duration {
	if g == nil || g.maxPause < 0 {
		return 0
	}
	return g.maxPause
}

// Enter marks one piece of foreground work as in flight until leave is
// called. leave may be called more than once; only the first counts.
func (g *Gate) Enter() (leave func()) {
	if g == nil {
		return func() {}
	}
	g.entered.Add(1)
	if g.active.Add(1) == 1 {
		g.reconcile()
	}
	var left atomic.Bool
	return func() {
		if left.Swap(true) {
			return
		}
		if g.active.Add(-1) == 0 {
			g.reconcile()
		}
	}
}

// reconcile makes idle match the count after it crossed zero. Every
// crossing is followed by a reconcile, and each reads the count under the
// lock, so the last one to run leaves idle right whatever the order in
// which concurrent crossings reach the lock.
func (g *Gate) reconcile() {
	g.mu.Lock()
	defer g.mu.Unlock()
	closed := isClosed(g.idle)
	switch busy := g.active.Load() > 0; {
	case busy && closed:
		g.idle = make(chan struct{})
	case !busy && !closed:
		close(g.idle)
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Yield is where background work gives way. With no foreground work in
// flight (or on a nil or never-waiting Gate) it returns nil at once.
// Otherwise it waits until the foreground count drops to zero, MaxPause
// passes, or ctx ends, and returns ctx's error in the last case only.
func (g *Gate) Yield(ctx context.Context) error {
	if g == nil || g.maxPause < 0 || g.active.Load() == 0 {
		return nil
	}
	g.mu.Lock()
	idle := g.idle
	g.mu.Unlock()
	if isClosed(idle) {
		// The count rose from zero a moment ago and its reconcile has not
		// run yet, or it has just dropped back: go on.
		return nil
	}
	g.waiting.Add(1)
	start := time.Now()
	t := time.NewTimer(g.maxPause)
	var err error
	timedOut := false
	select {
	case <-idle:
	case <-t.C:
		timedOut = true
	case <-ctx.Done():
		err = ctx.Err()
	}
	t.Stop()
	d := time.Since(start)
	g.waiting.Add(-1)
	g.waits.Add(1)
	if timedOut {
		g.timeouts.Add(1)
	}
	g.paused.Add(int64(d))
	if g.onPause != nil {
		g.onPause(d, timedOut)
	}
	return err
}

// Stats are a Gate's counters.
type Stats struct {
	// InFlight is the foreground work in flight now.
	InFlight int64
	// Waiting is the Yield calls waiting now.
	Waiting int64
	// Entered counts Enter calls.
	Entered uint64
	// Waits counts Yield calls that waited.
	Waits uint64
	// Timeouts counts the waits that ended at MaxPause with foreground
	// work still in flight.
	Timeouts uint64
	// Paused is the total time Yield calls waited.
	Paused time.Duration
}

// Stats returns the Gate's counters; zero for a nil Gate.
func (g *Gate) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	return Stats{
		InFlight: g.active.Load(),
		Waiting:  g.waiting.Load(),
		Entered:  g.entered.Load(),
		Waits:    g.waits.Load(),
		Timeouts: g.timeouts.Load(),
		Paused:   time.Duration(g.paused.Load()),
	}
}

// Package budget bounds the bytes that expensive responses hold in memory at
// once. Every expensive operation (getRepo CAR export, firehose backfill,
// getBlob, large getRecord/getBlocks, importRepo) reserves its expected heap
// cost from one shared Budget before it does any work, and gives it back
// when it is done.
//
// Admission is strictly first come, first served. A waiter that does not fit
// blocks everyone behind it, even those that would fit: other servers let
// small requests overtake a large one whenever a few bytes came free, and a
// request bigger than the free space then waited for 71 minutes. Here a
// large request waits at most until the requests ahead of it finish. A
// request larger than the whole capacity is admitted alone, once everything
// in flight has drained, so it is slow but never refused for its size.
//
// The wait queue is bounded. When it is full, Acquire fails at once with
// ErrOverloaded (an *OverloadedError carrying a Retry-After hint), before any
// work is done, which the HTTP layer answers with 503. Waiting respects the
// request context: a client that goes away leaves the queue, and if it was
// at the head, the requests behind it are woken.
//
// # What a reservation should be sized from
//
// A reservation is the heap the operation will hold at its peak, not the
// bytes it sends: a streamed CAR export holds one page of blocks at a time,
// a decoded record holds several times its encoded size. Measure each kind
// of work with MeasureHeap (bytes of live heap per byte of input or output)
// and reserve size × factor, with a floor for per-request fixed costs. When
// the size is only estimated up front (a repo's block count × average block
// size), reserve the estimate and true it up with Reservation.Resize once
// the real figure is known. The figures are recorded in docs/BENCHMARKS.md.
//
// The budget is per process: each node of a cluster has its own, sized from
// its own memory.
package budget

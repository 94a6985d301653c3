// Package dispatch is the three-layer dispatch limiter of the Tinker wire
// protocol notes §5.2, the gate every asample submission passes through.
//
// The layers are taken in this order and held until asample has been accepted
// or has failed (§5.1; polling a future holds none):
//
//  1. a count semaphore (Config.Count, 400 permits);
//  2. a throttled semaphore (Config.Throttled, 10 permits), taken only if a
//     backoff is "recent", evaluated right after the count permit;
//  3. a bytes budget (Config.Bytes, the server flag
//     sample_dispatch_bytes_semaphore_size, 10 MiB) charged with the
//     estimated prompt bytes, ×Config.BackoffFactor (20) if a backoff is
//     recent, evaluated again right before this layer.
//
// "Recent" means a deadline is set and now − deadline < Config.RecentWindow
// (10 s): from the moment a backoff is set until 10 s after it ends. The
// limiter learns the deadline from Config.BackoffUntil, which must be an
// in-memory read (backoff.Fleet.Until is an atomic load): the fast path does
// no I/O (architecture invariant 3).
//
// The bytes budget may go negative: a request waits only while the budget is
// below zero, and when it is ≥ 0 takes its full charge. So one request larger
// than the whole budget is admitted (when the budget is not negative) and can
// never deadlock; the next one waits until enough is released.
//
// Every layer serves its waiters first in, first out (a small request never
// overtakes a large one queued before it). A waiter whose context ends leaves
// the queue, and anything it held or was granted at that instant is given
// back, so the counts stay exact.
//
// # Reservations and the worker's pull loop
//
// Acquire is Reserve followed by Reservation.Acquire. A worker that must never
// hold more unacked-but-undispatched jobs than it has free dispatch slots
// (invariant 5) calls Reserve before it pulls a job from JetStream: Reserve
// blocks FIFO until a count permit is free and takes it. Once the job is
// decoded and tokenized, Reservation.Acquire takes the throttled and bytes
// layers and returns the Permit; if no job came, Reservation.Release gives the
// slot back. Free reports the free count permits for metrics.
//
// TryAcquire (of the Limiter, or of a Reservation) takes every layer at once
// if none would wait, and otherwise nothing (a reservation stays held). A
// caller that must set something up to wait (a context that also ends on an
// event of its own) tries first, and pays for that only when it must wait.
//
// Permit and Reservation are small values backed by a pooled ticket with a
// generation counter, so Acquire and Release allocate nothing and Release is
// idempotent (also on copies). To fit a "release func()" interface, pass
// p.Release (the method value costs one small allocation).
//
// Stats gives the occupancy of each layer with atomic reads.
package dispatch

// Package backoff keeps the backoff deadline of one Tinker account: the
// fleet-wide Fleet in a NATS JetStream KV bucket, and the per-process Local
// that mirrors the Python SDK's single backoff_until (§5.1).
//
// # What signals
//
// The caller decides; this package gives reasons and defaults. A 429 on
// asample backs off 1 s, or 5 s for a prompt estimated above 128 KiB
// (AsampleBackoff, §5.1, §5.3); a 402 inside the billing window does the same
// (§2.3). A paused_rate_limit or paused_capacity queue state seen while
// polling may signal PausedBackoff (5 s); the SDK only logs those (§4.3), so
// this is a fleet policy. A state the client does not know signals nothing.
//
// # The record and the clocks
//
// The KV key is the account name (AccountKey: a SHA-256 prefix of base URL
// and API key, never the key). Its value is JSON
//
//	{"floor_ns": F, "d_ns": D, "reason": ..., "floor_reason": ...}
//
// and the deadline it stands for is max(F, C + D), where C is the entry's
// Created() timestamp, assigned by the JetStream server when it stored the
// entry, capped at C + MaxPause (1 h, a 402 incident's billing window, §2.3,
// the longest the SDK stays paused for one cause): any client with write
// access to the bucket, or a bug, could else pause the fleet for ever. A
// worker warns once per entry it caps, and Signal writes no longer d.
// Every quantity is in the server's clock; no worker's clock is ever written,
// so a skewed worker can neither shorten nor stretch a pause.
//
// Signal(d) reads the entry (revision r, deadline cur) and writes
// {F: cur, D: d} with kv.Update(..., r) (kv.Create for the first write). The
// new deadline is max(cur, C' + d) ≥ cur: it only moves forward. On
// ErrKeyRevisionMismatch / ErrKeyExists (or, creating a key deleted by hand
// in a replicated bucket, the bare "wrong last sequence" 10164) someone else
// wrote in between; it re-reads and retries (JetStream notes §6).
//
// Each Fleet turns server times into local ones with an estimate of
// offset = server clock − local clock, kept as bounds [lo, hi]:
//
//   - a probe reads the bucket's stream info, which carries the server's
//     timestamp ts, between local t0 and t1: offset ∈ [ts − t1, ts − t0].
//     Probes run at Open, after every reconnect and every Resync (10 s), and
//     reset the bounds (clocks drift);
//   - every entry received at local time r was created before: offset ≥ C − r,
//     which raises lo.
//
// Until() = deadline − lo. Since lo ≤ offset, the local deadline is never
// earlier than the true one: an estimation error can only lengthen a pause,
// by the one-way latency of the probe (tens of µs on a LAN). Signal skips
// the write when the known deadline surely covers now + d less a coalescing
// slack (d/10, at most 250 ms), judged with hi (server now ≤ local now + hi),
// so a burst of 429s costs one write, not one per sample; a deadline that a
// failed write of this worker may have set alone does not count (the fleet
// would never learn of the pause). Before writing, Signal applies at once the
// lower bound now + lo + d of the new deadline, so the signalling worker's
// next Wait blocks without waiting for the watch, and still backs off when
// NATS is unreachable; the watch then delivers the exact value.
//
// # The watch
//
// One goroutine per Fleet (stopped by Close) watches the key and keeps the
// deadline in an atomic, so Until, Active and Recent are loads with no I/O
// (the dispatch fast path, architecture invariant 3). Following JetStream
// notes §6, the updates channel may close or go silent on a disconnect or a
// server restart, so the goroutine
//
//   - re-watches with ResumeFromRevision(last+1) when the channel closes, and
//     after every reconnect (a nats.Conn status listener; no handler of the
//     caller's is replaced), with exponential back-off from 50 ms to 5 s;
//   - re-reads the key after every (re)watch, on reconnect and every Resync,
//     and re-watches if the read shows a revision the watch never delivered
//     (silent watch) or an older one (the stream was recreated);
//   - every Resync, compares the bucket stream's creation time with the last
//     one read: a bucket deleted and made again numbers its revisions from 1
//     again, even up to the last one seen, so the worker watches it from its
//     start; and makes the bucket again if it is gone, since every Signal
//     fails meanwhile (a running fleet learns of either within Resync);
//   - forgets the last revision seen whenever a watch or read finds the bucket
//     gone, so the watch that follows, of a bucket made again by this worker or
//     by another meanwhile, starts from its first revision;
//   - stops the old watcher before creating a new one, so no consumer leaks.
//
// A deleted or purged key, or bucket, never shortens the in-memory deadline.
//
// Wait blocks until the deadline passes, on a timer; a state change closes a
// broadcast channel, so a waiter re-reads the deadline and re-blocks if it was
// extended. It never polls.
//
// Close may block up to the JetStream API timeout if the server is
// unreachable, while it deletes its watch consumer.
package backoff

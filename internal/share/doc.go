// Package share splits a capacity that the fleet measured among the workers that measured it.
//
// The Tinker service says it is full only by answering 429. After a 429 each worker measures
// how many samples the service holds for it (see the worker's capacity), and those peaks add
// up to what the service held when it said full. Alone, each worker would take its own peak
// as its limit; but a worker whose requests all came a moment too late measures nothing, has
// no limit, bursts after the pause and costs the whole fleet another 1 s pause and another
// measure (bench comparison 1 saw four workers need up to three).
//
// So every worker that measured writes a Report, its peak and how many samples it wants to
// run, under <account>.share.<worker> in the backoff bucket, waits Gather for the reports of
// the others, and reads them all. The reports of one round are those created (in the JetStream
// server's clock, so worker clocks do not matter) within Window of its own. Their peaks add
// up to the capacity, and Split divides it by want: every worker reads the same reports and
// computes the same division, so the limits add up to the capacity after one pause, and a
// worker that came too late gets its part too.
//
// A report also carries its worker's limit in force, with the age of the capacity it is a
// part of (a capacity on probation, measured once, is dated back by the worker so that it
// expires early, and its age carries that to every worker). A round whose peaks add up to
// no more than its limits divides the limits' sum instead, with the oldest age: a fleet
// under its limits never fills the service itself, so such a round was set off by a 429
// about a rate or another client, mostly while samples waited to be sent, and taking its
// peaks ratcheted the capacity down round by round. A worker that joins still gets its
// part: the others' parts shrink within their limits' sum. A report names the capacity its
// limit is a part of, and limits that add up to more than the largest of those (parts of
// different divisions: workers whose reports fell in different rounds, or one that kept its
// own peak) divide that capacity again, or the peaks if they are more. A round that counted a
// sample or two too many leaves limits just over what the service holds, and then every
// refill meets a 429; so a round whose peaks come under its limits, but within a sixteenth
// of the capacity measured, takes them. The slack is counted from that capacity (Share's
// Measured, which such a round keeps), so 429s about a rate cannot ratchet the limits down.
//
// Gather (300 ms, longer than a worker's measure may last, so that a round's first report
// reads its last) is well inside the 1 s pause that follows a 429, so the division is known
// before anyone sends again. A round whose reports cannot be read leaves each worker with its
// own peak. A worker that reported deletes its key when it closes, and the others, watching
// the board (WatchLeaves), forget their limits: the parts of those that stay no longer add up
// to the capacity, and the next 429 measures it again (one pause, instead of running at the
// old parts until they expire, up to the ttl). A crashed worker's report stays in the bucket
// but ages out of every round by Window; its presence notes stop, and ReportedSince tells the
// others whether it may have had a part to free. A round asks the server only for what was
// stored from Window before its own report on, so neither those reports nor the delete
// markers of closed workers are sent to it, however many a fleet leaves over weeks.
package share

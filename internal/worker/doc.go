// Package worker runs tinkerfleet jobs: it pulls them from the shared JetStream consumer, turns
// each into a Tinker sample (tokenize or render the chat, check the context window, pass the
// three-layer dispatch and the fleet backoff, submit, poll), publishes exactly one result per
// job and only then acks it.
//
// One Worker is one member of the fleet; cmd/worker runs one per process and `submit --local`
// runs one in-process. What it guarantees, with the invariants of docs/architecture.md:
//
//   - It reserves a dispatch count permit (and a job slot) before it pulls, so it never holds
//     more unacked jobs waiting for dispatch than it has free dispatch permits (invariant 5).
//   - A job is acked only after its result is stored in the results stream (invariant 2);
//     a job delivered again after that is acked without sampling twice.
//   - Permanent failures (an invalid job, a failed future of category user, a prompt too long
//     for the context window) publish an error result and Term the message; transient ones
//     NakWithDelay, using the fleet backoff's remaining time when it is the cause; the last
//     allowed delivery publishes an error result and keeps the payload in the dead stream. A
//     job whose last delivery died with its worker gets one more, kept by the consumer for
//     this, and is dead-lettered on it without being worked on; an advisory handler does the
//     same for jobs whose extra delivery died too: every worker hears each advisory, the
//     first dead-letters the job, and one that fails is tried again until it succeeds.
//   - A request refused with 401 or 403 is about the key or about the job: one credential
//     check tells which. A key the service refuses stops the worker (Run returns
//     ErrCredentialRefused) and fails no job: its jobs go back to the stream.
//   - A cancelled batch's jobs end as cancelled results without sampling, also those already
//     waiting to be sent (for result memory, a dispatch permit, room, or a pause to end),
//     which stop waiting on the cancel, and those this worker sent back to wait in the
//     stream (sentBack); only a sample already sent runs on.
//   - Results take bounded memory (Config.ResultMemory): no new sample is sent while the
//     results between their arrival and their storage fill it, so jobs whose results are
//     large (long samples, prompt logprobs of long prompts) slow down rather than exhaust
//     the machine.
//   - Stopping (Run's context done) stops pulling at once and hands back every job not yet
//     sent, lets the samples already sent finish within the grace period, then hands back
//     what is left, so that other workers take it immediately. A job handed back is stored
//     as such (queue.HandBack): a NATS server that stops right after the worker (submit
//     --local's) delivers it again as soon as it runs again.
//   - While Run runs, the worker notes its presence on the NATS server every
//     queue.PresencePeriod and removes the note as Run returns, so that submit tells a fleet
//     that is gone from one whose slots are all busy (queue.Presence). It follows the
//     others' notes too (queue.Silence): one that reported in a capacity share round within
//     the ttl and whose notes stop without its leaving (a crash) frees its part, as a
//     worker that leaves does.
package worker

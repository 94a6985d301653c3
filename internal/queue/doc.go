// Package queue owns tinkerfleet's use of NATS JetStream: the names of its streams, consumer and
// KV buckets, their creation, the embedded nats-server of the single-machine mode, connecting with
// credentials and TLS, and publishing jobs (with deduplicating message ids) and results.
//
// It moves bytes and does not interpret jobs: the job and result formats live in internal/jobs.
//
// The layout for a prefix p (default "tinkerfleet"):
//
//	stream P_JOBS     subjects p.jobs.<batch>               work queue, one durable consumer "workers"
//	                                                        (MaxDeliver + 1 deliveries: see Config)
//	stream P_RESULTS  subjects p.results.<batch>.<job>      limits, the first message per subject, kept days
//	stream P_DEAD     subjects p.dead.<batch>               payloads of jobs that exhausted MaxDeliver
//	KV p_batches      <batch> -> manifest (counts, digest, status)
//	KV p_backoff      <account> -> fleet backoff deadline (owned by internal/backoff)
//	                  <account>.share.<worker> -> a worker's capacity report (internal/share)
//	                  retry.<batch> -> why a worker last put off a job of the batch (RetryNote)
//	                  service.retry -> what a worker's Tinker client last retried, or the refused
//	                                   key that stopped a worker (ServiceNote)
//	                  worker.<id> -> a running worker's presence, renewed every 5 s (Presence)
//	                  local.reclaimed -> the last job sequence submit --local took back from a
//	                                     run that stopped without handing it back (Reclaim)
//	subject p.held    (core NATS, no stream) workers that hold results the server cannot
//	                  store answer a reader's question (AskHeld), which a full store cannot stop
//
// <job> is a digest of the custom_id (custom ids may hold characters that subjects cannot), so a
// result can be looked up by subject, and a repeated result is refused rather than added or put
// in the first one's place (ResultStored): the stream holds exactly one result per job, the
// first stored (invariant 1 of the design).
package queue

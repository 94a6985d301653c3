// Package cluster holds tinkerfleet's operational tests: a real three-node NATS JetStream
// cluster over loopback, with real workers (internal/worker, or the cmd/worker binary) and the
// simulated Tinker service (internal/tinkersim), under faults. It has no non-test code.
//
// The tests, and how to run them:
//
//   - TestStreamLeaderFailover: three embedded nats-servers clustered over loopback, streams
//     and buckets with three replicas, a batch of 1,000 jobs worked by three workers
//     connected to different nodes; the JOBS stream leader is shut down mid-batch, and every
//     custom_id must end with exactly one result. Skipped with -short.
//   - TestAWorkerCutOffFromItsNodeMovesToAnother: the network between the only worker and its
//     node is cut mid-batch as a dead link cuts it (nothing closes, nothing arrives); the
//     worker must notice by its pings, finish the batch from another node, one result per
//     job. About 40 s, most of it the pings' wait. Skipped with -short.
//   - TestNATSConfigPermissions: loads deploy/nats/nats-1.conf (with its auth.conf) into an
//     embedded server and runs a worker and submit's calls under the "worker" and "submit"
//     users: no permission violation in normal work, submit cannot take jobs, neither can
//     delete streams, admin can. Skipped with -short.
//   - TestChaos: only with -chaos (go test ./internal/cluster -run Chaos -chaos -v). Builds
//     cmd/worker, runs worker processes against the cluster and kills them with SIGKILL,
//     restarts a NATS node, and has the simulator inject 429 storms, paused queues, 5xx and
//     410s at once; it stops by itself (-chaos.duration) and prints jobs in, results out,
//     duplicates, losses, and how long the fleet stayed paused against how long the simulator
//     asked. deploy/README.md shows one run.
package cluster

#!/usr/bin/env bash
# deploy/chaos.sh: a drill of the real binaries on one machine. The simulator (capacity 64,
# with faults: 2 % 5xx on asample, 1 % 410 on polls, a 429 window and a paused window), three
# workers (the first serves the embedded NATS server the others join) and submit with a batch
# of JOBS lines. Mid-batch the worker that serves NATS is killed (SIGKILL) and started again
# on the same store, another worker is killed and replaced, a third is stopped (SIGTERM) and
# replaced. Then it checks that every line has exactly one result and that all are ok, and
# says how long the batch took after the last restart.
#
#   deploy/chaos.sh [JOBS]        (default 30000; about two minutes on 2 cores)
#
# Exit status 1 when a line has no result, two, or an error. Logs, metrics and the results
# are kept in the directory it prints. Needs Go and python3; ports 14222, 18765 and
# 19461-19463 on 127.0.0.1 must be free (it refuses to start otherwise).
set -euo pipefail

jobs=${1:-30000}
root=$(cd "$(dirname "$0")/.." && pwd)
# The drill's programs meet on fixed ports. One already served (another drill, a fleet on this
# machine) would not stop it: worker 1 would exit, and the others and submit would join the
# NATS server or the simulator found there, drilling nothing this script says and sending
# 30,000 jobs to whoever serves it.
for port in 14222 18765 19461 19462 19463; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		echo "chaos: 127.0.0.1:$port is already served (another drill?); the drill needs 14222, 18765 and 19461-19463 free" >&2
		exit 1
	fi
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/tinkerfleet-chaos.XXXXXX")
echo "chaos: building into $dir"
(cd "$root" && go build -o "$dir" ./cmd/submit ./cmd/worker ./cmd/tinkersim)
cd "$dir"

python3 - "$jobs" <<'EOF'
import json, sys
n = int(sys.argv[1])
with open("jobs.jsonl", "w") as f:
    for i in range(n):
        if i % 3 == 0:
            job = {"custom_id": f"j{i}", "model": "Qwen/Qwen3-8B", "prompt": f"Tell me about number {i}."}
        elif i % 3 == 1:
            job = {"custom_id": f"j{i}", "model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": f"hi {i}"}]}
        else:
            job = {"custom_id": f"j{i}", "model": "Qwen/Qwen3-8B", "prompt_tokens": [1, 2, 3, i % 1000]}
        job["sampling_params"] = {"max_tokens": 16}
        f.write(json.dumps(job) + "\n")
EOF

export TINKER_API_KEY=tml-chaos-drill TINKER_BASE_URL=http://127.0.0.1:18765 HF_HUB_OFFLINE=1
nats=nats://127.0.0.1:14222
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT

./tinkersim -addr 127.0.0.1:18765 -capacity 64 -base-latency 100ms -per-token-latency 1ms -long-poll-wait 5s \
	-fault kind=5xx,rate=0.02,endpoints=asample -fault kind=410,rate=0.01 \
	-fault kind=429,start=10s,duration=5s -fault kind=paused_capacity,start=35s,duration=5s \
	>sim.log 2>&1 &
pids+=($!)
sleep 0.5

# worker N [extra flags]: starts worker N (1 serves NATS), logging to wN.log (appended).
worker() {
	local n=$1
	shift
	if [[ $n == 1 ]]; then
		set -- --embedded-nats --embedded-port 14222 --data-dir data "$@"
	else
		set -- --nats-url "$nats" "$@"
	fi
	./worker "$@" --metrics-addr "127.0.0.1:1946$n" --concurrency 64 >>"w$n.log" 2>&1 &
	pids+=($!)
	eval "w$n=$!"
}

worker 1
sleep 2
worker 2
worker 3
./submit --nats-url "$nats" --progress lines --progress-interval 5s jobs.jsonl -o results.jsonl >submit.log 2>&1 &
submit=$!
pids+=($submit)

say() { echo "chaos: $(date +%T) $*"; }
sleep 15
kill -KILL "$w1"
wait "$w1" 2>/dev/null || true
say "killed the worker that serves NATS"
sleep 5
worker 1
say "started it again on the same store"
sleep 10
kill -KILL "$w2"
wait "$w2" 2>/dev/null || true
say "killed worker 2"
worker 2
say "started another"
sleep 5
kill -TERM "$w3"
wait "$w3" || true
say "stopped worker 3 (SIGTERM)"
worker 3
restarted=$(date +%s)
say "started another"

status=0
wait "$submit" || status=$?
took=$(($(date +%s) - restarted))
say "submit exited with status $status, ${took}s after the last restart"
echo "chaos: logs and results in $dir"
python3 - "$jobs" <<'EOF'
import collections, json, sys
n = int(sys.argv[1])
per_id, status, codes = collections.Counter(), collections.Counter(), collections.Counter()
with open("results.jsonl") as f:
    for line in f:
        r = json.loads(line)
        per_id[r["custom_id"]] += 1
        status[r["status"]] += 1
        if r["status"] != "ok":
            codes[r["error"]["code"]] += 1
done = [int(l.split("/", 1)[0]) for l in open("submit.log") if l[:1].isdigit() and "/" in l]
steps = [b - a for a, b in zip(done, done[1:])]
print("chaos: results per 5 s, in order (a slow stretch after a restart shows here):", " ".join(map(str, steps)))
missing = n - len(per_id)
twice = sum(1 for c in per_id.values() if c > 1)
print(f"chaos: {sum(per_id.values())} result lines for {n} jobs: {missing} without one, {twice} with more than one; {dict(status)} {dict(codes)}")
sys.exit(1 if missing or twice or status["ok"] != n else 0)
EOF

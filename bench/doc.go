// Command bench runs tinkerfleet's six side-by-side comparisons in one process and prints one
// table per comparison (case, measured, baseline, ratio, aim, result) and a summary:
//
//  1. throughput: jobs/s of 1, 2 and 4 workers (a process each, beside a NATS server and a
//     simulator with a fixed latency, a process each) against the ideal
//     min(capacity, total job slots) / latency, in steady state, counted by the results stored;
//  2. per-sample cost: CPU (getrusage) and bytes allocated per sample through the worker, end
//     to end, against the Tinker client alone doing the same samples (simulator in a child
//     process, so neither figure includes it);
//  3. fleet backoff: propagation p50/p99 of a Signal to every other backoff.Fleet against a raw
//     NATS fan-out, and asample calls that reach the simulator in an injected 429 window with
//     the fleet backoff and with per-worker backoffs, against one worker alone;
//  4. submit: lines/s of the submit command (built with go build), from its start to its
//     exit, on a generated JSONL file, against a raw JetStream async publish of the same lines;
//  5. memory: peak RSS (VmHWM) of a worker in a child process with a big backlog in the
//     stream against a small one, 400 samples in flight;
//  6. tokenizer: tokens/s of the built-in Qwen3 tokenizer on a 1 MB mixed corpus, with
//     strings.Fields over the same bytes as a floor.
//
// Usage:
//
//	go run ./bench -quick        # CI sizes, under 2 minutes on 2 cores (the default)
//	go run ./bench -full         # 1M-line submit and backlog, longer windows
//	go run ./bench -only=1,3 -v  # some comparisons, with progress on stderr
//
// A missed aim is printed as MISS and the program still exits 0: the output is a report. A
// comparison that did not run to the end (an error, an interrupt) makes it exit 2.
// The program re-executes itself (first argument -bench-child) for its helper processes: a
// simulator, a NATS server and a worker. Comparison 4 needs the go command and the
// checkout: run it with go run ./bench from the module.
package main

package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestAPublishInterruptedAnywhereIsCompletedOnce: a submit interrupted after k of its jobs
// reached the server, for many k, then run again, leaves exactly one job per valid line in
// the stream and a submitted manifest whose counts are the input's. Until the interrupt, the
// jobs stream takes k of the run's jobs and refuses the rest, so that the run cannot publish
// them all first, however late the interrupt comes.
func TestAPublishInterruptedAnywhereIsCompletedOnce(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	dir := t.TempDir()
	const valid = 4000
	lines := jobLines(valid)
	first, second := slices.Clone(lines[:valid/2]), lines[valid/2:]
	first = append(first, "{not json", `{"custom_id":"job-00001","model":"Qwen/Qwen3-8B","prompt":"again"}`)
	second = append([]string{`{"custom_id":"y","model":"Qwen/Qwen3-8B","prompt":"a","colour":"red"}`}, second...)
	const invalid = 3
	inA, inB := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	for p, ls := range map[string][]string{inA: first, inB: second} {
		if err := os.WriteFile(p, []byte(strings.Join(ls, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	q := bind(t, f)
	nc := q.JS.Conn()
	cuts := []int{0, 1, 2, 100, settleJobs - 1, settleJobs, settleJobs + 1, valid - 1, valid}
	for range 4 {
		cuts = append(cuts, rand.IntN(valid+1))
	}
	slices.Sort(cuts) // a cut drawn twice would find its batch submitted already
	cuts = slices.Compact(cuts)
	for _, k := range cuts {
		batch := fmt.Sprintf("cut-%d", k)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		before, err := q.Jobs.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if k > 0 { // (0 interrupts before the run; a MaxMsgs of 0 is none)
			// The run's first k jobs fill the stream: it waits for room, for longer than the
			// test takes (--store-wait), until the interrupt.
			full := before.Config
			full.MaxMsgs, full.Discard = int64(before.State.Msgs)+int64(k), jetstream.DiscardNew
			if _, err := q.JS.UpdateStream(ctx, full); err != nil {
				t.Fatal(err)
			}
		}
		var seen atomic.Int64
		cut, interrupt := context.WithCancel(ctx)
		sub, err := nc.Subscribe(q.Names.JobSubject(batch), func(*nats.Msg) {
			if seen.Add(1) == int64(k) {
				interrupt()
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			interrupt()
		}
		args := []string{"--skip-invalid", "--rejects", filepath.Join(dir, batch+".rejects"), "--batch-id", batch, "--store-wait", "1h", inA, inB}
		_, stderr, err := f.submit(cut, args...)
		sub.Unsubscribe()
		interrupt()
		// Room for the rest: the jobs the run had sent when it stopped (they may reach the
		// server after it returned), and the run again.
		if _, err := q.JS.UpdateStream(ctx, before.Config); err != nil {
			t.Fatal(err)
		}
		// With every job stored (k = valid), the run may write its manifest before it sees
		// the interrupt; either way the checks below hold.
		if k < valid && !errors.Is(err, errInterrupted) {
			t.Fatalf("k=%d: the interrupted run: %v, want interrupted\n%s", k, err, stderr)
		}
		if _, stderr, err := f.submit(ctx, args...); err != nil {
			t.Fatalf("k=%d: the run again: %v\n%s", k, err, stderr)
		}
		n, _, err := jobsWaiting(ctx, q, batch)
		if err != nil {
			t.Fatal(err)
		}
		if n != valid {
			t.Errorf("k=%d: %d jobs in the stream, want %d", k, n, valid)
		}
		after, err := q.Jobs.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]int{}
		for seq := before.State.LastSeq + 1; seq <= after.State.LastSeq; seq++ {
			msg, err := q.Jobs.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			ids[queue.CustomID(msg.Header)]++
		}
		if len(ids) != valid {
			t.Errorf("k=%d: %d distinct jobs, want %d", k, len(ids), valid)
		}
		m, _, err := q.GetManifest(ctx, batch)
		if err != nil || m.Status != queue.BatchSubmitted || m.Jobs != valid || m.Rejected != invalid || m.SubmittedAt.IsZero() {
			t.Errorf("k=%d: manifest %+v, %v: want submitted, %d jobs, %d rejected", k, m, err, valid, invalid)
		}
		cancel()
	}
}

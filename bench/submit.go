package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// runSubmit is comparison 4: lines per second from a JSONL file into JetStream through the
// submit command, against a raw async publish of the same lines.
func runSubmit(ctx context.Context, s settings, log io.Writer) (*table, error) {
	t := &table{ID: 4, Title: "submit: JSONL into JetStream vs raw publish"}
	r, err := newRig(ctx, rigConfig{})
	if err != nil {
		return t, err
	}
	defer r.close()
	path := filepath.Join(r.dir, "jobs.jsonl")
	size, err := writeJobsFile(path, s.SubmitLines)
	if err != nil {
		return t, err
	}
	q, err := r.connect(ctx, "bench-submit")
	if err != nil {
		return t, err
	}
	fmt.Fprintf(log, "bench:   building cmd/submit\n")
	submit, err := buildSubmit(ctx, r.dir)
	if err != nil {
		return t, err
	}

	// Each variant runs SubmitRounds times, alternated, and keeps its best rate: the cores are
	// shared, and the best run is the one least disturbed.
	type variant struct {
		name string
		run  func(round int) (int, error)
		best float64
	}
	vs := []*variant{
		{name: "raw publish", run: func(int) (int, error) { return rawPublish(ctx, q, path) }},
		{name: "submit command", run: func(k int) (int, error) {
			return submitCommand(ctx, submit, r.natsURL, fmt.Sprintf("submit%d", k), path, s.SubmitLines)
		}},
		{name: "raw publish with Nats-Msg-Id", run: func(k int) (int, error) { return rawPublishWithID(ctx, q, fmt.Sprintf("rawid%d", k), path) }},
		{name: "read+validate+encode", run: func(int) (int, error) { return readEncode(path) }},
	}
	for k := range max(s.SubmitRounds, 1) {
		for _, v := range vs {
			fmt.Fprintf(log, "bench:   %s of %d lines, round %d\n", v.name, s.SubmitLines, k+1)
			n, d, err := timed(func() (int, error) { return v.run(k) })
			if err != nil {
				return t, fmt.Errorf("%s: %w", v.name, err)
			}
			if n != s.SubmitLines {
				return t, fmt.Errorf("%s: %d of %d lines", v.name, n, s.SubmitLines)
			}
			if v.name != "read+validate+encode" { // the others publish
				info, err := q.Jobs.Info(ctx)
				if err != nil {
					return t, fmt.Errorf("stream info: %w", err)
				}
				if info.State.Msgs != uint64(n) {
					return t, fmt.Errorf("%s: the stream holds %d of %d lines", v.name, info.State.Msgs, n)
				}
				if q, err = renewJobs(ctx, q); err != nil {
					return t, err
				}
			}
			v.best = max(v.best, float64(n)/d.Seconds())
		}
	}
	raw, sub, id, enc := vs[0].best, vs[1].best, vs[2].best, vs[3].best
	rt := ratio(sub, raw)
	aim, v := atLeast(rt, 0.5)
	t.add(row{Case: fmt.Sprintf("%d lines (%.0f MB): the submit command, start to exit (validate+digest, then read+encode+publish with Nats-Msg-Id)", s.SubmitLines, float64(size)/1e6),
		Measured: fmt.Sprintf("%.0f lines/s", sub), Baseline: fmt.Sprintf("%.0f lines/s raw", raw), Ratio: rt, Aim: aim, Verdict: v})
	t.add(row{Case: "attribution: raw publish with a Nats-Msg-Id header (server dedup)",
		Measured: fmt.Sprintf("%.0f lines/s", id), Baseline: fmt.Sprintf("%.0f lines/s raw", raw),
		Ratio: ratio(id, raw), Verdict: verdictInfo})
	t.add(row{Case: "attribution: jobs.Reader + Job.Encode only, no publish (client CPU of one pass)",
		Measured: fmt.Sprintf("%.0f lines/s", enc), Baseline: fmt.Sprintf("%.0f lines/s raw", raw),
		Ratio: ratio(enc, raw), Verdict: verdictInfo})
	t.note("measured: cmd/submit (built by go build) run as a user runs it, `submit --nats-url URL --batch-id B --progress none FILE`, timed from its start to its exit: a validation pass over the file (every line checked, the input digest), then a publishing pass (jobs.Reader.Next -> Job.Encode -> queue.PublishJobAsync, futures settled every 2048), its connection and manifest writes")
	t.note("raw: bufio line read -> jetstream.PublishAsync of the same line bytes to the same file-backed stream, no id header, futures settled every 2048, on a connection opened before")
	t.note("best of %d alternated rounds per variant (shared cores)", max(s.SubmitRounds, 1))
	t.note("the file is generated in a temp dir and in the page cache; one embedded server, the jobs stream deleted and made again between runs (a purge keeps the ids of its 2 h duplicate window)")
	return t, nil
}

// renewJobs deletes the jobs stream and sets the queue up again on the same connection, so
// that the next run finds the server as the first did: no jobs and no job ids remembered. A
// purge would empty the stream but keep the ids of its duplicate window (2 h), and each run
// would carry those of all the runs before it, a million more each at full size, in the
// server's memory and in its every collection.
func renewJobs(ctx context.Context, q *queue.Queue) (*queue.Queue, error) {
	if err := q.JS.DeleteStream(ctx, q.Names.JobsStream()); err != nil {
		return nil, fmt.Errorf("delete the jobs stream: %w", err)
	}
	fresh, err := queue.Setup(ctx, q.JS, q.Config)
	if err != nil {
		return nil, fmt.Errorf("set the queue up again: %w", err)
	}
	return fresh, nil
}

// buildSubmit builds cmd/submit into dir, with the go command, from the module the bench is
// run in (go run ./bench, from the checkout), and returns the binary's path.
func buildSubmit(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("comparison 4 builds cmd/submit with the go command: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("comparison 4 builds cmd/submit: run the bench from the tinkerfleet checkout (go run ./bench)")
	}
	bin := filepath.Join(dir, "submit")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/submit")
	build.Dir = filepath.Dir(gomod)
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/submit: %w\n%s", err, out)
	}
	return bin, nil
}

// submitCommand runs the submit binary on path, into the NATS server at natsURL as batch, as
// a user runs it, and returns the lines it was given once it exits well (the caller checks
// the stream holds them).
func submitCommand(ctx context.Context, bin, natsURL, batch, path string, lines int) (int, error) {
	cmd := exec.CommandContext(ctx, bin, "--nats-url", natsURL, "--batch-id", batch, "--progress", "none", path)
	// Nothing of the bench's environment (a NATS_URL, credentials, a TINKERFLEET_ variable).
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Dir(path)}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s: %w: %s", bin, err, stderr.Bytes())
	}
	return lines, nil
}

// timed runs f and returns its count and how long it took.
func timed(f func() (int, error)) (int, time.Duration, error) {
	t0 := time.Now()
	n, err := f()
	return n, time.Since(t0), err
}

// writeJobsFile writes n native job lines and returns the file size.
func writeJobsFile(path string, n int) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, fmt.Errorf("jobs file: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	for i := range n {
		j := benchJob(i, benchMaxTokens)
		fmt.Fprintf(bw, `{"custom_id": %q, "model": %q, "prompt": %q, "sampling_params": {"max_tokens": %d, "temperature": 0.7}, "metadata": {"row": %d}}`+"\n",
			j.CustomID, j.Model, j.Prompt, benchMaxTokens, i)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return 0, fmt.Errorf("jobs file: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return 0, fmt.Errorf("jobs file: %w", err)
	}
	return st.Size(), f.Close()
}

// rawPublish publishes every line of path as it is, with the same settling cadence.
func rawPublish(ctx context.Context, q *queue.Queue, path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("open input: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	subject := q.Names.JobSubject("raw")
	var pending []jetstream.PubAckFuture
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, io.EOF) && len(line) == 0 {
			break
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return n, fmt.Errorf("read: %w", err)
		}
		data := make([]byte, len(line)-1) // the line without its newline, owned by the message
		copy(data, line)
		fut, err := q.JS.PublishAsync(subject, data)
		if err != nil {
			return n, fmt.Errorf("publish: %w", err)
		}
		n++
		if pending = append(pending, fut); len(pending) >= 2048 {
			if err := settle(ctx, pending); err != nil {
				return n, err
			}
			pending = pending[:0]
		}
	}
	return n, settle(ctx, pending)
}

// rawPublishWithID is rawPublish with a Nats-Msg-Id per line, so the server's duplicate
// window does the same work as for submit.
func rawPublishWithID(ctx context.Context, q *queue.Queue, batch, path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("open input: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	subject := q.Names.JobSubject(batch)
	var pending []jetstream.PubAckFuture
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, io.EOF) && len(line) == 0 {
			break
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return n, fmt.Errorf("read: %w", err)
		}
		data := make([]byte, len(line)-1)
		copy(data, line)
		fut, err := q.JS.PublishAsync(subject, data, jetstream.WithMsgID(queue.MsgID(batch, strconv.Itoa(n))))
		if err != nil {
			return n, fmt.Errorf("publish: %w", err)
		}
		n++
		if pending = append(pending, fut); len(pending) >= 2048 {
			if err := settle(ctx, pending); err != nil {
				return n, err
			}
			pending = pending[:0]
		}
	}
	return n, settle(ctx, pending)
}

// readEncode is the client half of submit's loop alone: read, validate, encode.
func readEncode(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("open input: %w", err)
	}
	defer f.Close()
	r := jobs.NewReader(f, path, jobs.Limits{})
	n := 0
	for {
		j, err := r.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if _, err := j.Encode(); err != nil {
			return n, err
		}
		n++
	}
}

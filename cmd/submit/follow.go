package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// progressOptions say how progress is shown.
type progressOptions struct {
	mode     string
	interval time.Duration
}

func (o *progressOptions) register(s *envflag.Set) {
	s.String(&o.mode, "progress", "TINKERFLEET_PROGRESS", "auto", "auto (a bar on a terminal, lines otherwise), bar, lines or none")
	s.Duration(&o.interval, "progress-interval", "TINKERFLEET_PROGRESS_INTERVAL", 10*time.Second, "time between progress lines when not on a terminal")
}

// summary counts the results of a batch by status.
type summary struct {
	ok, failed, cancelled int
}

func (s summary) total() int { return s.ok + s.failed + s.cancelled }

func (s *summary) add(status string) {
	switch status {
	case "ok":
		s.ok++
	case "cancelled":
		s.cancelled++
	default:
		s.failed++
	}
}

// followToFile follows the results into the JSONL file at path. A result already in the file
// is not written again, so an interrupted run resumes by appending what is missing.
func followToFile(ctx context.Context, q *queue.Queue, m queue.Manifest, path string, wait bool, po progressOptions, env *environment) (summary, error) {
	seen := map[string]bool{}
	var sum summary
	f, err := openOutput(path, seen, &sum)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	got, err := followFrom(ctx, q, m, f, seen, sum, wait, po, env)
	if cerr := f.Sync(); err == nil && cerr != nil {
		err = fmt.Errorf("write %s: %w", path, cerr)
	}
	return got, err
}

// follow reads the results of a batch from the start of the results stream, writes each to
// out (nil: count them only, reading headers), shows progress, and returns once every job of
// m has a result, or, with wait false, once it has read what is stored now.
func follow(ctx context.Context, q *queue.Queue, m queue.Manifest, out io.Writer, wait bool, po progressOptions, env *environment) (summary, error) {
	return followFrom(ctx, q, m, out, map[string]bool{}, summary{}, wait, po, env)
}

// followFrom is follow for a reader that already holds the results in seen (job tokens),
// counted in sum.
func followFrom(ctx context.Context, q *queue.Queue, m queue.Manifest, w io.Writer, seen map[string]bool, sum summary, wait bool, po progressOptions, env *environment) (summary, error) {
	var out *bufio.Writer
	if w != nil {
		out = bufio.NewWriterSize(w, 256<<10)
		defer out.Flush()
	}
	codec, err := queue.NewCodec(0)
	if err != nil {
		return sum, err
	}
	defer codec.Close()

	cons, err := q.JS.OrderedConsumer(ctx, q.Names.ResultsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{q.Names.ResultsFilter(m.BatchID)},
		HeadersOnly:    out == nil,
	})
	if err != nil {
		return sum, fmt.Errorf("follow results: %w", err)
	}
	prog := newProgress(po, env, m.Jobs, sum.total())
	defer prog.finish(&sum)

	for {
		if wait && sum.total() >= m.Jobs {
			return sum, nil
		}
		fetchCtx, cancel := context.WithTimeout(ctx, time.Second)
		batch, err := cons.Fetch(1024, jetstream.FetchContext(fetchCtx))
		if err != nil {
			expired := errors.Is(fetchCtx.Err(), context.DeadlineExceeded) // before cancel, which sets it
			cancel()
			switch {
			case ctx.Err() != nil:
				return sum, ctx.Err()
			case expired:
				continue // a loaded machine let the second pass before the request left
			}
			return sum, fmt.Errorf("follow results: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			token := msg.Subject()[strings.LastIndexByte(msg.Subject(), '.')+1:]
			if seen[token] {
				continue
			}
			seen[token] = true
			sum.add(msg.Headers().Get(queue.HeaderStatus))
			if out != nil {
				data, err := codec.Decode(nats.Header(msg.Headers()), msg.Data())
				if err != nil {
					cancel()
					return sum, fmt.Errorf("result %s: %w", msg.Subject(), err)
				}
				out.Write(data)
				if err := out.WriteByte('\n'); err != nil {
					cancel()
					return sum, fmt.Errorf("write results: %w", err)
				}
			}
		}
		cancel()
		if err := batch.Error(); err != nil && ctx.Err() != nil {
			return sum, ctx.Err()
		}
		if out != nil && n > 0 {
			if err := out.Flush(); err != nil {
				return sum, fmt.Errorf("write results: %w", err)
			}
		}
		prog.update(&sum)
		if !wait && n == 0 {
			return sum, nil
		}
	}
}

// openOutput opens the output file for appending, after reading the custom ids it already
// holds, so that an interrupted run resumes without writing any result twice. A last line
// cut short by the interruption is dropped.
func openOutput(path string, seen map[string]bool, sum *summary) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	br := bufio.NewReaderSize(f, 1<<20)
	var keep int64
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			break // a line without its newline was cut short: dropped below
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		var r struct {
			CustomID string `json:"custom_id"`
			Status   string `json:"status"`
		}
		if json.Unmarshal(line, &r) != nil || r.CustomID == "" {
			f.Close()
			return nil, fmt.Errorf("%s holds a line that is not a result (line ending at byte %d); give another -o file", path, keep+int64(len(line)))
		}
		token := queue.JobToken(r.CustomID)
		if !seen[token] {
			seen[token] = true
			sum.add(r.Status)
		}
		keep += int64(len(line))
	}
	if err := f.Truncate(keep); err != nil {
		f.Close()
		return nil, fmt.Errorf("output: %w", err)
	}
	if _, err := f.Seek(keep, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("output: %w", err)
	}
	return f, nil
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// runFailed writes the input lines of a batch's jobs whose results are errors, and of those
// whose results are lost (lostResults), as they were in its files, so that they can be
// submitted again (as another batch: a job's first result is final in its own).
func runFailed(ctx context.Context, args []string, env *environment) error {
	var (
		output    string
		retryable bool
	)
	sess, batch, err := openBatch(ctx, "failed", args, env, func(fs *flag.FlagSet, _ *envflag.Set) {
		fs.StringVar(&output, "o", "", "write the lines to this file (default standard output)")
		fs.BoolVar(&retryable, "retryable", false, "only the errors marked retryable (the same job may succeed), and the lost results")
	})
	if err != nil {
		return err
	}
	defer sess.close()
	m, err := resultsManifest(ctx, sess.q, batch)
	if err != nil {
		return err
	}
	// Lost results are counted first: when some are, the lines of the jobs without a result
	// are written with the errors.
	lost, err := lostResults(ctx, sess.q, m, 0)
	if err != nil {
		return err
	}
	failed, seen, err := failedJobs(ctx, sess.q, m, retryable)
	if err != nil {
		return err
	}
	// The files must be those the batch was made of: the same digest, checked before a line
	// is written.
	h := sha256.New()
	if err := eachJob(m.Files, jobs.Limits{}, h, nil, func(jobs.Job, []byte, lineAt, error) error { return nil }); err != nil {
		return fmt.Errorf("batch %s's input (run this where it was submitted): %w", batch, err)
	}
	if hex.EncodeToString(h.Sum(nil)) != m.Digest {
		return fmt.Errorf("batch %s's input files %q changed since it was submitted: its lines cannot be told apart", batch, m.Files)
	}
	var w io.Writer = env.stdout
	var file *outputFile // compressed as its name says, as results' -o is
	if output != "" {
		if err := checkDistinct(m.Files, outputPath{"-o", output}); err != nil {
			return err // os.Create would empty the input before its lines are read
		}
		f, err := os.Create(output)
		if err != nil {
			return err
		}
		defer f.Close()
		if file, err = newOutputFile(f, outputCompression(output)); err != nil {
			return err
		}
		w = file
	}
	out := bufio.NewWriter(w)
	errored, missing := 0, 0
	err = eachJob(m.Files, jobs.Limits{}, nil, nil, func(j jobs.Job, line []byte, _ lineAt, err error) error {
		switch {
		case err != nil: // never published
			return nil
		case failed[j.CustomID]:
			errored++
		case lost > 0 && !seen[queue.JobKeyOf(j.CustomID)]:
			missing++
		default:
			return nil
		}
		out.Write(line)
		return out.WriteByte('\n')
	})
	if err == nil {
		err = out.Flush()
	}
	if err == nil && file != nil {
		err = file.Close()
	}
	if err != nil {
		return fmt.Errorf("write the failed lines: %w", err)
	}
	which := "errors"
	if retryable {
		which = "errors marked retryable"
	}
	lostWhy := ""
	if missing > 0 {
		lostWhy = "results will never come: " + lostCause(sess.q, m)
	}
	switch {
	case errored+missing == 0:
		fmt.Fprintf(env.stderr, "batch %s has no results that are %s: nothing to try again\n", batch, which)
	case missing == 0:
		fmt.Fprintf(env.stderr, "%s of batch %s whose results are %s; submit them as a new batch to try them again\n",
			plural(errored, "line"), batch, which)
	case errored == 0:
		fmt.Fprintf(env.stderr, "%s of batch %s whose %s; submit them as a new batch to try them again\n",
			plural(missing, "line"), batch, lostWhy)
	default:
		fmt.Fprintf(env.stderr, "%s of batch %s: %d whose results are %s, and %d whose %s; submit them as a new batch to try them again\n",
			plural(errored+missing, "line"), batch, errored, which, missing, lostWhy)
	}
	return nil
}

// failedJobs reads the results of m and returns the custom ids of those that are errors (only
// retryable ones, with retryable), and the job keys (queue.JobKey) of every result read.
func failedJobs(ctx context.Context, q *queue.Queue, m queue.Manifest, retryable bool) (failed map[string]bool, seen map[queue.JobKey]bool, err error) {
	c := &failedCollector{retryable: retryable, ids: map[string]bool{}}
	seen = map[queue.JobKey]bool{}
	if _, err := followFrom(ctx, q, m, c, resultNative, seen, summary{}, false, progressOptions{mode: "none"}, &environment{}); err != nil {
		return nil, nil, err
	}
	return c.ids, seen, c.err
}

// failedCollector takes tinkerfleet result lines, as follow writes them, and keeps the custom
// ids of the errors (read with parseOutputLine, as an output file's lines are).
type failedCollector struct {
	retryable bool
	ids       map[string]bool
	rest      []byte // a line not yet ended
	err       error
}

func (c *failedCollector) Write(p []byte) (int, error) {
	c.rest = append(c.rest, p...)
	for {
		i := bytes.IndexByte(c.rest, '\n')
		if i < 0 {
			return len(p), nil
		}
		r, status, ok := parseOutputLine(c.rest[:i])
		if !ok && c.err == nil {
			c.err = fmt.Errorf("read a result: %s is not one", jobs.Excerpt(c.rest[:i]))
		}
		if status == string(jobs.StatusError) && (!c.retryable || r.Error != nil && r.Error.Retryable) {
			c.ids[r.CustomID] = true
		}
		c.rest = c.rest[i+1:]
	}
}

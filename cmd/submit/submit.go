package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
)

const submitUsage = `usage: submit [flags] FILE...

Validates every line of the JSONL files (plain, or compressed with zstd or gzip), then
publishes one job per line as one batch. With -o (or --wait) it follows the results and
writes them to a JSONL file; an interrupted wait resumes where it stopped when run again.
Without --nats-url it runs an embedded NATS server and a worker in this process.

Subcommands: status BATCH, results BATCH, failed BATCH, cancel BATCH, delete BATCH, list,
tokenize (each has -h).

Flags:
`

// submitOptions are the flags of `submit FILE...`.
type submitOptions struct {
	conn        connOptions
	local       localOptions
	batchID     string
	skipInvalid bool
	dryRun      bool
	rejects     string
	wait        bool
	output      string
	format      string
	progress    progressOptions
	limits      jobs.Limits
	storeWait   time.Duration
}

// maxReported bounds the bad lines printed; all of them are counted.
const maxReported = 50

func runSubmit(ctx context.Context, args []string, env *environment) (runErr error) {
	var o submitOptions
	fs, s := newFlagSet("", env)
	fs.Usage = func() { fmt.Fprint(env.stderr, submitUsage); fs.PrintDefaults() }
	o.conn.register(s)
	o.local.register(s)
	o.progress.register(s)
	s.String(&o.batchID, "batch-id", "TINKERFLEET_BATCH_ID", "", "batch id (default: derived from the input's digest, so re-running the same files is the same batch)")
	s.Bool(&o.skipInvalid, "skip-invalid", "TINKERFLEET_SKIP_INVALID", false, "publish the valid lines and write a JSON line per invalid one (its file, line, field and problem) to --rejects")
	s.Bool(&o.dryRun, "dry-run", "TINKERFLEET_DRY_RUN", false, "validate the lines and print what they would ask of the service (jobs, samples and prompt tokens per model); publish nothing, need no NATS server")
	s.String(&o.rejects, "rejects", "TINKERFLEET_REJECTS", "", "file of the invalid lines' problems, one JSON line each, with --skip-invalid (default BATCH.rejects.jsonl; schemas/rejects.schema.json)")
	s.Bool(&o.wait, "wait", "TINKERFLEET_WAIT", false, "wait until every job has a result")
	fs.StringVar(&o.output, "o", "", "write the results to this JSONL file (.zst, .gz: compressed; implies --wait)")
	s.PositiveDuration(&o.storeWait, "store-wait", "TINKERFLEET_STORE_WAIT", 15*time.Second,
		"how long publishing waits for a NATS server that cannot store jobs (a stream leader election; workers freeing room) before it stops")
	registerResultFormat(s, &o.format)
	if err := s.Err(); err != nil {
		return err
	}
	files, err := envflag.Parse(fs, args)
	if err != nil {
		return err
	}
	if err := o.conn.checkLocal(fs); err != nil {
		return err
	}
	format, err := parseResultFormat(o.format)
	if err != nil {
		return err
	}
	if err := o.progress.check(); err != nil {
		return err
	}
	if len(files) == 0 {
		fs.Usage()
		return fmt.Errorf("no input files: %w", errUsage)
	}
	for _, f := range files {
		if isSubcommand(f) {
			if _, err := os.Stat(f); err != nil {
				return fmt.Errorf("%q is a subcommand: write it first, as in 'submit %s --nats-url URL …' (or ./%s for a file): %w", f, f, f, errUsage)
			}
		}
		if err := checkReadTwice(f, o.dryRun); err != nil {
			return err
		}
	}
	if err := checkDistinct(files, outputPath{"-o", o.output}, outputPath{"--rejects", o.rejects}); err != nil {
		return err
	}
	if o.output != "" {
		o.wait = true
	}
	if o.local.simulate && o.conn.conn.URL != "" && !o.conn.local && !o.dryRun {
		// The simulator runs in this process, for its own worker: a fleet's workers would
		// sample the jobs on the real service.
		return fmt.Errorf("--simulate samples in this process, with --local; with --nats-url alone the fleet's workers would sample on the real service: %w", errUsage)
	}
	if (o.conn.conn.URL == "" || o.conn.local) && !o.local.simulate && !o.dryRun {
		// The local worker's credentials, before a line is read or a store made.
		if _, _, err := tinker.CredentialsFrom(env.getenv); err != nil {
			return fmt.Errorf("the local worker needs a Tinker key (or --simulate): %w", err)
		}
	}
	if o.conn.conn.URL == "" || o.conn.local || o.dryRun {
		// Where the local worker and the dry run find tokenizers, before a line is read.
		if err := tokenizer.CheckDir(o.local.tokenizerDir); err != nil {
			return fmt.Errorf("--tokenizer-dir (or TINKERFLEET_TOKENIZER_DIR) %w", err)
		}
	}
	if o.batchID != "" {
		if err := queue.ValidateBatchID(o.batchID); err != nil {
			return err
		}
		// The commands on one batch look for a sim-… batch in the simulated store of a local
		// data directory: there, the id must say truly where the batch is.
		local := o.conn.conn.URL == "" || o.conn.local
		if local && o.local.simulate != strings.HasPrefix(o.batchID, simulatedBatchPrefix) {
			if o.local.simulate {
				return fmt.Errorf("--batch-id %q: a --simulate batch's id begins with %q (status and the others look for it by that): %w", o.batchID, simulatedBatchPrefix, errUsage)
			}
			return fmt.Errorf("--batch-id %q: an id beginning with %q names a --simulate batch: %w", o.batchID, simulatedBatchPrefix, errUsage)
		}
	}

	// 1. Validate everything before publishing anything. With --skip-invalid the rejects go
	// straight to a file (named after the batch once the digest is known): a file with a
	// million bad lines never sits in memory.
	var rejectsTmp *os.File
	if o.skipInvalid {
		dir := "."
		if o.rejects != "" {
			dir = filepath.Dir(throughLinks(o.rejects)) // renamed there: where a link points
		}
		if rejectsTmp, err = createTemp(dir, ".rejects-*.jsonl"); err != nil {
			return fmt.Errorf("rejects file: %w", err)
		}
		defer os.Remove(rejectsTmp.Name()) // a no-op once renamed
		defer rejectsTmp.Close()
	}
	var rejectsOut io.Writer // nil: count the rejects only
	if rejectsTmp != nil {
		rejectsOut = rejectsTmp
	}
	var est *estimate
	var onJob func(jobs.Job)
	if o.dryRun {
		est = newEstimate(tokenizer.NewRegistry(o.local.tokenizerOptions(env)))
		onJob = func(j jobs.Job) { est.add(ctx, j) }
	}
	scan, err := validate(ctx, files, o.limits, newPassProgress(o.progress, env, "validating", "lines", 0), rejectsOut, onJob)
	if err != nil {
		return err
	}
	local := o.conn.conn.URL == "" || o.conn.local
	if o.batchID == "" {
		o.batchID = "b-" + scan.digest[:16]
		if local && o.local.simulate {
			o.batchID = simulatedBatchPrefix + scan.digest[:16]
		}
	}
	if o.dryRun {
		fmt.Fprintf(env.stdout, "batch %s (dry run: nothing is published): %s, %d invalid\n", o.batchID, plural(scan.accepted, "valid line"), scan.rejected)
		if err := est.print(env.stdout); err != nil {
			return err
		}
	}
	if scan.rejected > 0 && !o.skipInvalid {
		return fmt.Errorf("%d of %d lines are invalid (nothing was published; fix them or use --skip-invalid): %w",
			scan.rejected, scan.rejected+scan.accepted, errInvalidInput)
	}
	if o.skipInvalid && !o.dryRun {
		path := cmp.Or(o.rejects, o.batchID+".rejects.jsonl")
		if err := writeRejects(rejectsTmp, path, o.rejects != "", scan.rejected > 0); err != nil {
			return err
		}
		if scan.rejected > 0 {
			fmt.Fprintf(env.stderr, "%s skipped; written to %s\n", plural(scan.rejected, "invalid line"), path)
		}
	}
	if scan.accepted == 0 {
		return fmt.Errorf("no valid lines to publish: %w", errInvalidInput)
	}
	if o.dryRun {
		return nil
	}
	// The output file is opened, and every line it holds checked, before a job is published:
	// no job is sent for results that could not be written.
	var out *outputFile // until following the results takes it
	seen, held := map[queue.JobKey]bool{}, summary{}
	if o.output != "" {
		var created bool
		if out, created, err = openOutput(o.output, o.batchID, seen, &held); err != nil {
			return err
		}
		defer func() {
			if out != nil {
				_ = out.Close()
			}
			if created && runErr != nil { // a run that ended before its first result leaves no empty file
				removeIfEmpty(o.output)
			}
		}()
	}

	if local && o.local.simulate {
		// Simulated batches live apart from real ones. The batch id is the input's digest, so
		// in one store the real run of a file tried first with --simulate took the simulated
		// batch for done and wrote the simulator's text as its results; and either run's
		// local worker would have sampled the other's unfinished jobs.
		o.conn.dataDir = simulatedDataDir(o.conn.dataDir)
	}
	sess, err := openSession(ctx, o.conn, env, false)
	if err != nil {
		var inUse *queue.DataDirInUseError
		if errors.As(err, &inUse) && inUse.URL != "" && !o.local.simulate {
			// The holder may be a worker --embedded-nats, which serves until it is stopped:
			// its fleet samples the batch once it is published there.
			instead := "instead"
			if o.conn.local {
				instead = "instead of --local"
			}
			return fmt.Errorf("%w; if it is a worker serving NATS (worker --embedded-nats), submit the batch to its server %s: --nats-url %s", err, instead, inUse.URL)
		}
		return err
	}
	defer sess.close()
	// Following the results ends when the local worker stops by itself: nothing else would
	// bring them.
	followCtx, workerStopped := context.WithCancelCause(ctx)
	defer workerStopped(nil)
	if local {
		stopped := func(err error) { workerStopped(fmt.Errorf("%w: %w", errWorkerStopped, err)) }
		if err := sess.startWorker(ctx, o.local, o.conn.queue, env, stopped); err != nil {
			return err
		}
		o.progress.local = &inProcess{held: sess.held, opening: sess.opening, dataDir: o.conn.dataDir}
		sess.awaitOpen(ctx, firstAnswerWait)
		if cause := context.Cause(followCtx); errors.Is(cause, errWorkerStopped) {
			return fmt.Errorf("%w (nothing was published)", cause)
		}
	}

	if err := checkJobSizes(ctx, files, o.limits, scan.longest, sess.q.JS.Conn().MaxPayload(), env.stderr); err != nil {
		return err
	}

	// 2. Publish, unless this batch was fully submitted before. A local worker that stops
	// meanwhile (a refused key) stops it too: no job would be sampled.
	m, again, err := publish(followCtx, sess.q, o.batchID, files, scan, o.limits, o.storeWait, o.progress, env)
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("%w while publishing batch %s: run the same command again to publish the rest (no job is published twice)",
			errInterrupted, o.batchID)
	case err != nil && followCtx.Err() != nil:
		return fmt.Errorf("%w; publishing batch %s stopped: run the same command again to go on (the jobs published so far are kept in %s, and none is published twice)",
			context.Cause(followCtx), o.batchID, o.conn.dataDir)
	case errors.Is(err, errCannotStore):
		room := "make room in the server's JetStream store (delete finished batches: submit delete; or raise its max_file_store), or let its cluster elect a leader"
		if local {
			room = "delete finished batches (submit delete), free disk space where " + o.conn.dataDir + " is, or move that folder to a disk with room and pass --data-dir"
		}
		return fmt.Errorf("publishing batch %s stopped: %w: %s, then run the same command again: the jobs published so far are kept, and none is published twice",
			o.batchID, err, room)
	case err != nil:
		return err
	}
	if !again {
		fmt.Fprintf(env.stderr, "batch %s: %s submitted\n", m.BatchID, plural(m.Jobs, "job"))
	}
	fmt.Fprintln(env.stdout, m.BatchID)
	if !o.wait {
		if local {
			fmt.Fprintln(env.stderr, "note: --local without --wait or -o stops the in-process worker now; run again with -o to finish the batch")
		}
		return nil
	}

	// 3. Follow the results.
	var sum summary
	if out != nil {
		following := out
		out = nil
		sum, err = followInto(followCtx, sess.q, m, o.output, following, format, seen, held, true, o.progress, env)
	} else {
		sum, err = follow(followCtx, sess.q, m, nil, format, true, o.progress, env)
	}
	if cause := context.Cause(followCtx); err != nil && ctx.Err() == nil && errors.Is(cause, errWorkerStopped) {
		return fmt.Errorf("%w; %d of %d results of batch %s%s, its other jobs wait in %s: run the same command again to go on",
			cause, sum.total(), m.Jobs, m.BatchID, outputNote(o.output), o.conn.dataDir)
	}
	if err != nil && ctx.Err() != nil {
		goOn := "the fleet goes on with it; run the same command again, or submit results " + m.BatchID + outputFlag(o.output) + " --wait, to collect the rest"
		if local {
			goOn = "its other jobs wait in " + o.conn.dataDir + "; run the same command again to go on"
		}
		return interruptedWith(sum, m, o.output, goOn)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stderr, "batch %s: %s (%d ok, %d error, %d cancelled)%s%s\n", m.BatchID,
		plural(sum.total(), "result"), sum.ok, sum.failed, sum.cancelled, outputNote(o.output), tokensNote(sum.tokens))
	return nil
}

// interruptedWith is the error of a wait for m's results that an interrupt stopped with sum
// read (into output, if not empty); goOn says how to go on.
func interruptedWith(sum summary, m queue.Manifest, output, goOn string) error {
	return fmt.Errorf("%w with %d of %d results of batch %s%s: %s", errInterrupted, sum.total(), m.Jobs, m.BatchID, outputNote(output), goOn)
}

// outputFlag is " -o path", or nothing without a path.
func outputFlag(path string) string {
	if path == "" {
		return ""
	}
	return " -o " + path
}

func outputNote(path string) string {
	if path == "" {
		return ""
	}
	return " in " + path
}

// scanResult is what the validation pass learned.
type scanResult struct {
	accepted, rejected int
	digest             string // hex sha256 over the input files, in order
	longest            int    // the longest valid line, in bytes
}

// writeRejects puts tmp, the rejects written, in place at path: --rejects when named says so,
// or else the default file. A file is written whenever some line was rejected or --rejects
// names one, an empty one when none was, so that a script never reads an earlier run's
// rejects as this run's; the default file is emptied only where an earlier run left one, and
// not made for nothing.
func writeRejects(tmp *os.File, path string, named, rejected bool) error {
	if !rejected && !named {
		if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
	}
	target := throughLinks(path)
	if fi, err := os.Stat(target); err == nil {
		// It takes the place of the user's file, whose mode may keep the prompts private.
		if err := tmp.Chmod(fi.Mode().Perm()); err != nil {
			return fmt.Errorf("rejects file: %w", err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("rejects file: %w", err)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return fmt.Errorf("rejects file: %w", err)
	}
	return nil
}

// throughLinks is path with its symbolic links resolved when it names a file that exists, and
// else path: a file put in place by a rename takes the place of the file a link points to, not
// of the link, which would become a file beside the one the user meant.
func throughLinks(path string) string {
	if target, err := filepath.EvalSymlinks(path); err == nil {
		return target
	}
	return path
}

// validate reads every file once, reports bad lines (the first maxReported of them on stderr,
// all of them to rejects when it is not nil), computes the input digest and, when onJob is not
// nil, calls it with every valid job. It shows how far it is on prog. Memory: the custom_id
// set. An interrupt (ctx ending) stops it at the next line, with errInterrupted.
func validate(ctx context.Context, files []string, limits jobs.Limits, prog *passProgress, rejects io.Writer, onJob func(jobs.Job)) (*scanResult, error) {
	res := &scanResult{}
	stderr := prog.lines()
	lines := 0
	var rejectsOut *bufio.Writer
	var enc *json.Encoder
	if rejects != nil {
		rejectsOut = bufio.NewWriter(rejects)
		enc = json.NewEncoder(rejectsOut)
	}
	h := sha256.New()
	var read atomic.Int64
	prog.setRead(&read, inputSize(files))
	err := eachJob(files, limits, h, &read, func(j jobs.Job, line []byte, at lineAt, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("%w while reading the input, at %s: nothing was published", errInterrupted, at)
		}
		if !errors.Is(err, jobs.ErrEmptyFile) { // a line (an empty file is none)
			if lines++; lines%256 == 0 {
				prog.update(lines)
			}
		}
		var le *jobs.LineError
		switch {
		case err == nil:
			res.accepted++
			res.longest = max(res.longest, len(line))
			if onJob != nil {
				onJob(j)
			}
		case errors.As(err, &le):
			res.rejected++
			if res.rejected <= maxReported {
				fmt.Fprintln(stderr, le.Error())
			}
			if enc != nil {
				if err := enc.Encode(rejectLine{File: le.File, Line: le.Line, Field: le.Field, Message: le.Msg}); err != nil {
					return fmt.Errorf("rejects file: %w", err)
				}
			}
		default: // jobs.ErrEmptyFile
			fmt.Fprintln(stderr, err.Error())
		}
		return nil
	})
	prog.end(lines, err == nil)
	if err != nil {
		return nil, err
	}
	if res.rejected > maxReported {
		fmt.Fprintf(stderr, "… and %d more invalid lines\n", res.rejected-maxReported)
	}
	res.digest = hex.EncodeToString(h.Sum(nil))
	if rejectsOut != nil {
		if err := rejectsOut.Flush(); err != nil {
			return nil, fmt.Errorf("rejects file: %w", err)
		}
	}
	return res, nil
}

// lineAt is where a line is: its file and 1-based line number.
type lineAt struct {
	file string
	line int
}

func (at lineAt) String() string { return fmt.Sprintf("%s:%d", at.file, at.line) }

// eachJob reads files in order as one batch (one custom_id set, line numbers per file) and
// calls fn with each line's job, the line as read (valid until fn returns) and where it is, or
// its error (*jobs.LineError, or jobs.ErrEmptyFile for a file without job lines); fn's error
// stops the reading. hash, when not nil, sees every byte read and a zero byte after each
// file, so that moving a line to another file changes the digest. read, when not nil, counts
// the bytes read from the files as stored (before decompression; ahead of fn's lines by what
// the reading has buffered). The lines are parsed on every core (jobs.Reader.SetParallel), a
// group at a time, and fn is called in order.
func eachJob(files []string, limits jobs.Limits, hash io.Writer, read *atomic.Int64, fn func(j jobs.Job, line []byte, at lineAt, err error) error) error {
	var r *jobs.Reader
	for _, name := range files {
		f, err := openInput(name, read)
		if err != nil {
			return err
		}
		var in io.Reader = f
		if hash != nil {
			in = io.TeeReader(f, hash)
		}
		if r == nil {
			r = jobs.NewReader(in, name, limits)
			r.SetCheck(renderable)
			r.SetParallel(runtime.GOMAXPROCS(0))
		} else {
			r.NextFile(in, name)
		}
		for {
			j, err := r.Next()
			if err == io.EOF {
				break
			}
			var le *jobs.LineError
			if err != nil && !errors.As(err, &le) && !errors.Is(err, jobs.ErrEmptyFile) {
				f.Close()
				return err // reading failed: not a line's fault
			}
			var line []byte
			if err == nil {
				line = r.Raw()
			}
			if err := fn(j, line, lineAt{name, r.Line()}, err); err != nil {
				f.Close()
				return err
			}
		}
		f.Close()
		if hash != nil {
			hash.Write([]byte{0})
		}
	}
	return nil
}

// renderable rejects a chat job for a model whose chat template the workers do not know
// (tokenizer.ChatFamily), or whose template has no thinking switch or reasoning effort where
// the job sets one (tokenizer.CheckOptions): either would otherwise end as an error result
// once published. A job that names a checkpoint (model_path) is left to the worker, which
// learns its base model from the service. eachJob's Reader runs it on every valid line
// (jobs.Reader.SetCheck), so a line it refuses takes no custom_id.
func renderable(j jobs.Job) *jobs.FieldError {
	if len(j.Messages) == 0 || j.Model == "" {
		return nil
	}
	openai := j.Format == jobs.FormatOpenAIChat
	lineErr := func(native, openaiField string, err error) *jobs.FieldError {
		field := native
		if openai {
			field = openaiField
		}
		return &jobs.FieldError{Field: field, Msg: err.Error()}
	}
	if _, ok := tokenizer.ChatFamily(j.Model); !ok {
		return lineErr("model", "body.model", tokenizer.NoChatFamily(j.Model))
	}
	err := tokenizer.CheckOptions(j.Model, tokenizer.RenderOptions{Thinking: j.Thinking, ReasoningEffort: j.ReasoningEffort})
	switch {
	case err == nil:
		return nil
	case j.ReasoningEffort != "":
		return lineErr("reasoning_effort", "body.reasoning_effort", err)
	default:
		return lineErr("thinking", "body.chat_template_kwargs", err)
	}
}

// storeWaiter publishes jobs (and writes the batch's manifest) and waits for the server to
// store each. While the server cannot store anything (queue.StoreUnavailable: no stream
// leader during an election, out of room until workers take jobs, the connection lost under
// a publish), it tries again: a job the stream refused at once the first time (the jobs
// published behind it were refused in the same moment, and the server may store them now),
// then 100 ms apart doubling to 2 s, for up to wait from the first refusal that made it wait;
// anything stored ends the wait. The duplicate window keeps a job published twice (its first
// ack lost) stored once.
type storeWaiter struct {
	q      *queue.Queue
	wait   time.Duration
	stderr io.Writer
	since  time.Time // the first refusal of the current wait (zero: jobs are being stored)
	pause  time.Duration
	said   time.Time // when it last said that it waits
}

// storeWaitSayEvery is how often, at most, submit says that it waits for the server to store
// jobs: room that comes and goes (workers freeing it, results taking it) would otherwise
// begin a wait, and a line, many times a second.
const storeWaitSayEvery = 30 * time.Second

// send publishes a job with publish (which returns its future), trying again while the
// connection cannot take it now (a write that failed as its server went away, a reconnect
// buffer that is full: queue.StoreUnavailable), as stored does for a refused job.
func (w *storeWaiter) send(ctx context.Context, publish func() (jetstream.PubAckFuture, error)) (jetstream.PubAckFuture, error) {
	for {
		f, err := publish()
		if err == nil {
			return f, nil
		}
		if !queue.StoreUnavailable(err) {
			return nil, err
		}
		if err := w.refusedAgain(ctx, err); err != nil {
			return nil, err
		}
	}
}

// stored returns once the job of f is stored, or why it is not.
func (w *storeWaiter) stored(ctx context.Context, f jetstream.PubAckFuture) error {
	for refused := 0; ; refused++ {
		var err error
		select {
		case <-f.Ok():
			w.since = time.Time{}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case err = <-f.Err():
		}
		if !queue.StoreUnavailable(err) {
			return fmt.Errorf("publish job: %w", err)
		}
		if refused > 0 { // refused again: the server still cannot store jobs
			if err := w.refusedAgain(ctx, err); err != nil {
				return err
			}
		}
		msg := f.Msg()
		if f, err = w.send(ctx, func() (jetstream.PubAckFuture, error) { return w.q.JS.PublishMsgAsync(msg) }); err != nil {
			return fmt.Errorf("publish job: %w", err)
		}
	}
}

// refusedAgain counts a job refused again, for err: it begins the wait (saying so, at most
// every storeWaitSayEvery) if none is under way, ends it with errCannotStore once it has lasted
// w.wait, and otherwise pauses before the next try.
func (w *storeWaiter) refusedAgain(ctx context.Context, err error) error {
	now := time.Now()
	if w.since.IsZero() {
		w.since, w.pause = now, 100*time.Millisecond
		if w.said.IsZero() || now.Sub(w.said) >= storeWaitSayEvery {
			w.said = now
			fmt.Fprintf(w.stderr, "the NATS server cannot store jobs now (%v); trying again for up to %v\n", err, w.wait)
		}
	}
	if now.Sub(w.since) >= w.wait {
		return fmt.Errorf("%w (%w)", errCannotStore, err)
	}
	if err := pause(ctx, min(w.pause, w.wait-now.Sub(w.since))); err != nil {
		return err
	}
	w.pause = min(2*w.pause, 2*time.Second)
	return nil
}

// writeManifest writes m over revision rev (0 creates it), as queue.PutManifest does, waiting
// as for a job while the server cannot store it (the bucket's leader election: no answer, or
// none in time). A write tried again that finds m already there (its first try was stored
// and the answer lost) has succeeded.
func (w *storeWaiter) writeManifest(ctx context.Context, m queue.Manifest, rev uint64) (uint64, error) {
	for tried := false; ; tried = true {
		newRev, err := w.q.PutManifest(ctx, m, rev)
		if err == nil {
			w.since = time.Time{}
			return newRev, nil
		}
		if tried && (errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)) {
			if cur, curRev, gerr := w.q.GetManifest(ctx, m.BatchID); gerr == nil && cur.Status == m.Status && cur.Digest == m.Digest {
				w.since = time.Time{}
				return curRev, nil
			}
		}
		timedOut := ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)
		if !queue.StoreUnavailable(err) && !timedOut || ctx.Err() != nil {
			return 0, err
		}
		if err := w.refusedAgain(ctx, err); err != nil {
			return 0, err
		}
	}
}

// pause waits d, or returns ctx's error if it ends first.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errCannotStore: the NATS server could not store a job (out of room, no stream leader, no
// answer); publishing stopped there.
var errCannotStore = errors.New("the NATS server cannot store jobs")

// rejectLine is one line of the rejects file.
type rejectLine struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// publish waits for the jobs it published to be stored every settleJobs of them, or sooner
// once they hold settleBytes: each one's future holds the job until then, and 2048 jobs of
// long prompts held a file of them whole (up to 16 GiB at the line limit).
const (
	settleJobs  = 2048
	settleBytes = 32 << 20
)

// publish records the manifest and publishes every valid line, streaming the files again
// (read and encoded ahead of the publishing, in startEncoding's goroutine).
// A batch already fully submitted with the same digest is not published again (again is true,
// and it says so); a batch whose publishing was interrupted is published again, and the
// duplicate window (and the workers' result check) drop what was already there.
func publish(ctx context.Context, q *queue.Queue, batch string, files []string, scan *scanResult, limits jobs.Limits, storeWait time.Duration, po progressOptions, env *environment) (m queue.Manifest, again bool, err error) {
	prog := newPassProgress(po, env, "publishing", "jobs stored", scan.accepted)
	stored := 0
	defer func() { prog.end(stored, err == nil) }()
	waiter := &storeWaiter{q: q, wait: storeWait, stderr: prog.lines()}
	m, rev, err := q.GetManifest(ctx, batch)
	republished := err == nil // an earlier publish of this batch was interrupted
	switch {
	case errors.Is(err, queue.ErrNoBatch):
		m = queue.Manifest{BatchID: batch, Status: queue.BatchPublishing, Files: files, Digest: scan.digest,
			Jobs: scan.accepted, Rejected: scan.rejected, CreatedAt: time.Now().UTC()}
		if rev, err = waiter.writeManifest(ctx, m, 0); err != nil {
			return m, false, err
		}
	case err != nil:
		return m, false, err
	case m.Digest != scan.digest:
		return m, false, fmt.Errorf("batch id %s is already used by a batch of other input (created %s); choose another --batch-id",
			batch, m.CreatedAt.Format(time.RFC3339))
	case m.Status == queue.BatchDeleted:
		return m, false, fmt.Errorf("%w; to run these files again, give them another --batch-id", deletedErr(m))
	case m.Status == queue.BatchSubmitted || (m.Status == queue.BatchCancelled && !m.SubmittedAt.IsZero()):
		when := m.CreatedAt.Local().Format(time.DateTime)
		switch {
		case m.Status != queue.BatchCancelled:
		case m.CancelledAt.IsZero(): // a manifest from before the time was kept
			when += ", and cancelled"
		default:
			when += ", and cancelled on " + m.CancelledAt.Local().Format(time.DateTime)
		}
		fmt.Fprintf(env.stderr, "batch %s was already submitted on %s: not publishing it again\n", batch, when)
		return m, true, nil
	case m.Status == queue.BatchCancelled:
		// Cancelled while its publishing was interrupted: the jobs never published are
		// published now, for the workers to end each as cancelled, so that every job has its
		// line; without them the run waited for results that could never come, and called
		// them removed from the server.
		fmt.Fprintf(env.stderr, "batch %s was cancelled before it was all published: publishing the rest, which the workers end as cancelled\n", batch)
	}

	var pending []jetstream.PubAckFuture
	pendingBytes := 0
	settle := func() error {
		for _, f := range pending {
			if err := waiter.stored(ctx, f); err != nil {
				return err
			}
		}
		stored += len(pending)
		prog.update(stored)
		clear(pending) // each future holds its job
		pending, pendingBytes = pending[:0], 0
		return nil
	}
	enc := startEncoding(ctx, files, limits)
	defer enc.stop()
	for chunk := range enc.chunks {
		for _, job := range chunk {
			fut, err := waiter.send(ctx, func() (jetstream.PubAckFuture, error) {
				return q.PublishJobAsync(batch, job.customID, job.data, republished)
			})
			if err != nil {
				return m, false, err
			}
			pending, pendingBytes = append(pending, fut), pendingBytes+len(job.data)
			if len(pending) >= settleJobs || pendingBytes >= settleBytes {
				if err := settle(); err != nil {
					return m, false, err
				}
			}
		}
	}
	accepted, rejected, err := enc.result()
	if err != nil {
		return m, false, err
	}
	if err := settle(); err != nil {
		return m, false, err
	}
	if accepted != scan.accepted || rejected != scan.rejected {
		return m, false, fmt.Errorf("the input changed while it was being submitted (%d valid lines, %d when validated); batch %s stays %s: submit it again",
			accepted, scan.accepted, batch, queue.BatchPublishing)
	}
	if m.Status != queue.BatchCancelled { // a cancelled batch stays so, now wholly published
		m.Status = queue.BatchSubmitted
	}
	m.SubmittedAt = time.Now().UTC()
	if _, err := waiter.writeManifest(ctx, m, rev); err != nil {
		// Someone cancelled it meanwhile (or deleted it): keep their status. Any other failure
		// (a store that cannot take the write) is the run's, or the batch would stay
		// publishing for ever with the run taken for a success.
		if cur, _, gerr := q.GetManifest(ctx, batch); gerr == nil && cur.Status != queue.BatchPublishing {
			if cur.Status == queue.BatchCancelled && cur.SubmittedAt.IsZero() {
				// Every job was stored before the cancel: say so, or a rerun would take the
				// batch for one cancelled half published, and publish it all again.
				if upd, uerr := q.UpdateManifest(ctx, batch, func(m *queue.Manifest) error {
					if m.Status == queue.BatchCancelled && m.SubmittedAt.IsZero() {
						m.SubmittedAt = time.Now().UTC()
					}
					return nil
				}); uerr == nil {
					cur = upd
				}
			}
			return cur, false, nil
		}
		return m, false, err
	}
	return m, false, nil
}

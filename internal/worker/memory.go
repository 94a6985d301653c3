package worker

import (
	"context"
	"sync"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
)

// DefaultResultMemory is the memory a worker lets its results take at once by default
// (Config.ResultMemory): within the 1 GiB the deploy/ manifests give a worker, with room for
// the collector's headroom and everything else.
const DefaultResultMemory = 256 << 20

// decodedCellBytes and resultCellBytes are the memory a result takes per number it carries (a
// sampled token with its logprob and text, a prompt logprob, a top-k cell): decoded from the
// reply, 16 bytes; at its peak, 64: decoded, made a result (16), encoded as JSON (about 20)
// and compressed (3 to 5). Measured with a 25,000-token prompt's top-20 logprobs and with 16
// samples of 8,192 tokens.
const (
	decodedCellBytes = 16
	resultCellBytes  = 64
)

// jsonCellBytes is about the JSON of one such number, to size a result's encode buffer once.
const jsonCellBytes = 20

// resultMemory bounds the memory that a worker's results take between their arrival and
// their storage. Most results are a few kilobytes and never come near it. But a result
// carries every number the job asked for: the top-20 prompt logprobs of a 25,000-token
// prompt are 500,000 cells, 10 MB of JSON and about 32 MB while it is decoded and encoded,
// and 400 job slots of them took a worker past 22 GB, until the kernel killed it and the
// fleet sampled them all again.
//
// A job's result is charged in steps, each what it holds then:
//   - before its sample is sent, the decoded size of what its request makes certain (prompt
//     logprobs and top-k cells, one per prompt token): its reply takes that much when it
//     comes. No sample is sent while the charges reach the limit; one charged more than the
//     whole limit is sent once the others are under it (so it runs, at worst, alone).
//   - when its reply is back, at once, what it holds decoded (its sampled tokens are not
//     certain before), which it holds while it waits to grow.
//   - then the peak of the result it carries (grow), once the charges are under the limit,
//     or once no result is being made or stored: the replies on their way and those back
//     would otherwise wait for each other for ever, so one goes on alone.
//   - once encoded, the stored message, until the stream acks it (resize); then nothing.
//
// So the charges stay within the limit, one result's peak and the decoded replies waiting to
// grow (held whether charged or not; charged, they hold new samples back). Charging the peak
// before the sample is sent held a worker to 6 such samples at once within 256 MiB, 40 % slower
// than 1 GiB: the sample's time at the service is most of a job's, and the peak lasts only
// while its result is encoded. Charging the decoded size and never waiting for the peak let 32
// replies that came together take 950 MiB.
//
// A limit of 0 or less bounds nothing and costs nothing.
type resultMemory struct {
	limit int64

	mu      sync.Mutex
	used    int64         // every charge
	pending int64         // the charges of samples not grown yet: on their way, or back and waiting
	room    chan struct{} // closed, and nil again, when a charge shrinks
}

// charge is what one job's result is charged against a resultMemory. Its zero value charges
// nothing; it has one owner at a time (the job's sample, then its settlement).
type charge struct {
	m     *resultMemory
	n     int64
	grown bool // no longer pending
}

// reserve waits until the charges are under the limit, then charges n. It ends early with
// ctx's error, with errStopping once stopping is done (the worker hands the job back), or
// with errBatchCancelled once the job's batch ends (end, set up only if the job waits; nil:
// none).
func (m *resultMemory) reserve(ctx, stopping context.Context, end *batchEnd, n int64) (charge, error) {
	if m.limit <= 0 {
		return charge{}, nil
	}
	m.mu.Lock()
	for m.used >= m.limit {
		if err := m.wait(ctx, stopping, end); err != nil {
			m.mu.Unlock()
			return charge{}, err
		}
	}
	m.used += n
	m.pending += n
	m.mu.Unlock()
	return charge{m: m, n: n}, nil
}

// wait lets go of mu until the charges change, and takes it again. Call with mu held.
func (m *resultMemory) wait(ctx, stopping context.Context, end *batchEnd) error {
	if m.room == nil {
		m.room = make(chan struct{})
	}
	room := m.room
	m.mu.Unlock()
	ended := end.done() // outside mu: it takes the cancel set's lock
	var err error
	select {
	case <-room:
	case <-ctx.Done():
		err = ctx.Err()
	case <-stopping.Done():
		err = errStopping
	case <-ended:
		err = errBatchCancelled
	}
	m.mu.Lock()
	return err
}

// changed wakes the waiters to look again. Call with mu held.
func (m *resultMemory) changed() {
	if m.room != nil {
		close(m.room)
		m.room = nil
	}
}

// charged returns the memory charged now.
func (m *resultMemory) charged() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used
}

// grow makes the charge n bytes, its reply's peak, once the charges are under the limit or
// no result is being made or stored. Only ctx ends the wait: the sample was sent, and a
// stopping worker finishes it.
func (c *charge) grow(ctx context.Context, n int64) error {
	m := c.m
	if m == nil {
		return nil
	}
	m.mu.Lock()
	for m.used >= m.limit && m.used > m.pending {
		if err := m.wait(ctx, context.Background(), nil); err != nil {
			m.mu.Unlock()
			return err
		}
	}
	m.pending -= c.n
	m.used += n - c.n
	if n < c.n {
		m.changed()
	}
	m.mu.Unlock()
	c.n, c.grown = n, true
	return nil
}

// resize makes the charge n bytes without waiting, and wakes the waiters if it shrank.
func (c *charge) resize(n int64) {
	m := c.m
	if m == nil || n == c.n {
		return
	}
	m.mu.Lock()
	m.used += n - c.n
	if !c.grown {
		m.pending += n - c.n
	}
	if n < c.n {
		m.changed()
	}
	m.mu.Unlock()
	c.n = n
}

// release ends the charge.
func (c *charge) release() { c.resize(0) }

// certainCells counts the numbers that a job's request makes certain its result will carry,
// before it is sampled: one prompt logprob and k top-k cells per prompt token.
func certainCells(job jobs.Job, promptLen int) int {
	n := job.TopKPromptLogprobs
	if job.PromptLogprobs {
		n++
	}
	return n * promptLen
}

// replyCells counts the numbers a sample's reply carries: its sampled tokens (each with a
// logprob, and text to come), prompt logprobs and top-k cells.
func replyCells(r *tinker.SampleResponse) int {
	n := len(r.PromptLogprobs)
	for _, s := range r.Sequences {
		n += len(s.Tokens)
	}
	for _, row := range r.TopKPromptLogprobs {
		n += len(row)
	}
	return n
}

// sampledTokens counts the sampled tokens of a reply: the cells a job that asked for OpenAI
// logprobs adds, each token's bytes (jobs.Sample.TokenBytes).
func sampledTokens(r *tinker.SampleResponse) int {
	n := 0
	for _, s := range r.Sequences {
		n += len(s.Tokens)
	}
	return n
}

package main

import (
	"context"
	"errors"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
)

// encodedJob is a valid line's job, encoded as it is published.
type encodedJob struct {
	customID string
	data     []byte
}

// The publishing pass reads and encodes the jobs in a goroutine of its own, a chunk of jobs
// ahead of the publishing: parsing every line again (about 2 µs a line) ran on the same
// goroutine as the publishing (bench comparison 4: 80-83k lines/s, 86-91k with the parsing
// beside it). A chunk holds up to encodeChunkJobs jobs, or encodeChunkBytes
// bytes and one line; encodeChunksAhead of them wait at most, so the jobs read ahead hold a
// few MiB at most besides those waiting for their acks (settleBytes).
const (
	encodeChunkJobs   = 256
	encodeChunkBytes  = 1 << 20
	encodeChunksAhead = 2
)

// encoding is the reading and encoding of the publishing pass (startEncoding).
type encoding struct {
	chunks <-chan []encodedJob
	cancel context.CancelFunc
	done   chan struct{} // closed once the goroutine has returned

	// Set by the goroutine before done is closed.
	accepted, rejected int
	err                error
}

// startEncoding starts reading files in order, as eachJob does, and sending each valid
// line's job, encoded, on chunks. Read chunks until it is closed, then call result; call stop
// in any case, which ends the reading and waits for it. The goroutine stops at its next chunk
// once ctx ends.
func startEncoding(ctx context.Context, files []string, limits jobs.Limits) *encoding {
	ctx, cancel := context.WithCancel(ctx)
	chunks := make(chan []encodedJob, encodeChunksAhead)
	e := &encoding{chunks: chunks, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		defer close(chunks)
		var chunk []encodedJob
		size := 0
		send := func() error {
			if len(chunk) == 0 {
				return nil
			}
			select {
			case chunks <- chunk:
			case <-ctx.Done():
				return ctx.Err()
			}
			chunk, size = nil, 0
			return nil
		}
		e.err = eachJob(files, limits, nil, nil, func(j jobs.Job, _ []byte, _ lineAt, err error) error {
			var le *jobs.LineError
			switch {
			case errors.As(err, &le):
				e.rejected++ // reported by the validation pass
				return nil
			case err != nil: // jobs.ErrEmptyFile
				return nil
			}
			e.accepted++
			data, err := j.Encode()
			if err != nil {
				return err
			}
			if chunk == nil {
				chunk = make([]encodedJob, 0, encodeChunkJobs)
			}
			chunk, size = append(chunk, encodedJob{customID: j.CustomID, data: data}), size+len(data)
			if len(chunk) >= encodeChunkJobs || size >= encodeChunkBytes {
				return send()
			}
			return nil
		})
		if e.err == nil {
			e.err = send()
		}
	}()
	return e
}

// result waits for the reading to end and returns how many valid and invalid lines it read,
// or why it stopped (ctx's error, if it ended first).
func (e *encoding) result() (accepted, rejected int, err error) {
	<-e.done
	return e.accepted, e.rejected, e.err
}

// stop ends the reading, if it still runs, and waits for its goroutine to return.
func (e *encoding) stop() {
	e.cancel()
	<-e.done
}

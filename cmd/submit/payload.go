package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// checkJobSizes returns an error, naming each line, when jobs of files are larger than a NATS
// server whose max_payload is maxPayload accepts. Such a job cannot be published at all: found
// while publishing, it would stop the batch halfway. The embedded server and deploy/'s take
// 8 MiB and need the pass only for lines over about 2.7 MiB; a stock nats-server takes 1 MiB,
// as long as a line of a long prompt. longest is the longest valid line: a job's encoding is
// at most encodedGrowth times its line plus encodedSlack, so unless that could be too large
// the files are not read again. An interrupt (ctx ending) stops it at the next line.
func checkJobSizes(ctx context.Context, files []string, limits jobs.Limits, longest int, maxPayload int64, stderr io.Writer) error {
	if maxPayload <= 0 || int64(encodedGrowth*longest+encodedSlack+queue.JobHeaderRoom) <= maxPayload {
		return nil
	}
	over := 0
	err := eachJob(files, limits, nil, nil, func(j jobs.Job, _ []byte, at lineAt, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("%w while reading the input, at %s: nothing was published", errInterrupted, at)
		}
		if err != nil {
			return nil // reported by the validation pass
		}
		data, err := j.Encode()
		if err != nil {
			return err
		}
		if int64(len(data)+queue.JobHeaderRoom) > maxPayload {
			if over++; over <= maxReported {
				fmt.Fprintf(stderr, "%s: the job is %d bytes, over the %d bytes a job may take in a message to the NATS server (its max_payload, %d, less %d for headers)\n",
					at, len(data), maxPayload-queue.JobHeaderRoom, maxPayload, queue.JobHeaderRoom)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if over > maxReported {
		fmt.Fprintf(stderr, "… and %d more jobs too large\n", over-maxReported)
	}
	if over > 0 {
		return fmt.Errorf("%d jobs are larger than the NATS server accepts (nothing was published): raise max_payload in its configuration (deploy/nats/cluster.conf sets 8MB), or shorten those lines: %w",
			over, errJobsTooLarge)
	}
	return nil
}

// A job's encoding is at most encodedGrowth times its line, plus encodedSlack. Token ids grow
// the most: one written with an exponent, as JSON allows, is written out whole, "2e9," (4
// bytes) as "2000000000," (11), so a line of them grows 2.75 times; characters that JSON may
// hold raw but the encoding escapes, U+2028 and U+2029, twice. The slack is for what grows by
// a constant: the fields a line may leave out, and a lone number such as a seed of 9e18.
// (With a bound of twice the line, a line of such ids passed the check, and its job then
// stopped the publishing halfway.)
const (
	encodedGrowth = 3
	encodedSlack  = 4 << 10
)

// errJobsTooLarge says that jobs are larger than the NATS server accepts in a message.
var errJobsTooLarge = errors.New("jobs too large for the NATS server")

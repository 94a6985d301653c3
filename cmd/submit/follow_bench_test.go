package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// BenchmarkResultLineNative measures what submit does to each native result it writes as
// stored (resultLine, native format): the check that it is one line of this job's result,
// and the copy. Results of 16 and 4,096 sampled tokens with their logprobs.
func BenchmarkResultLineNative(b *testing.B) {
	for _, n := range []int{16, 4096} {
		res := jobs.Result{CustomID: "job-00000042", BatchID: "b-5c1f0000", Status: jobs.StatusOK, Model: "Qwen/Qwen3-8B",
			Samples:  []jobs.Sample{{Text: " The sky looks blue at noon because air scatters short wavelengths", StopReason: jobs.StopReasonLength}},
			Usage:    &jobs.Usage{PromptTokens: 40, CompletionTokens: n},
			Attempts: 1, LatencyMS: 812, Metadata: []byte(`{"doc":42,"split":"train"}`)}
		for k := range n {
			res.Samples[0].Tokens = append(res.Samples[0].Tokens, 1000+k*7919%150000)
			res.Samples[0].Logprobs = append(res.Samples[0].Logprobs, -float64(k%97)/13)
		}
		data, err := res.AppendJSON(nil)
		if err != nil {
			b.Fatal(err)
		}
		key := queue.JobKeyOf(res.CustomID)
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			var line []byte
			for b.Loop() {
				if line, err = resultLine(line[:0], data, time.Time{}, resultNative, res.BatchID, key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

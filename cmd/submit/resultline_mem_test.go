package main

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestOpenAIResultLineMemoryIsBounded: writing a stored result as an OpenAI Batch output line
// (resultLine, --result-format openai or an OpenAI job's result) allocates at most twice the
// stored line's size beyond the line it writes, for the largest result a job can ask for: 16
// samples of 32,768 tokens with OpenAI logprobs (ids, logprobs and each token's bytes). Before,
// it decoded the whole result with encoding/json, at 20 to 30 times the stored size (the most
// for tokens of one byte), so a result of queue.MaxResultBytes (256 MiB) took GiBs. The line
// is the one DecodeResult and AppendOpenAI write. A line in another form than the worker's,
// which only DecodeResult reads as before, is held to 8 times (it was 12 to 13). Bytes
// allocated are measured, not time.
func TestOpenAIResultLineMemoryIsBounded(t *testing.T) {
	for _, format := range []string{jobs.FormatOpenAIChat, jobs.FormatOpenAICompletions} {
		for _, tokLen := range []int{1, 4} {
			rng := rand.New(rand.NewPCG(1, uint64(tokLen)))
			r := jobs.Result{CustomID: "job-1", BatchID: "batch-1", Status: jobs.StatusOK, Model: "Qwen/Qwen3-8B",
				Format: format, OpenAILogprobs: true, Usage: &jobs.Usage{PromptTokens: 100, CompletionTokens: 16 * 32768}, Attempts: 1}
			for range 16 {
				s := jobs.Sample{StopReason: jobs.StopReasonLength}
				var text []byte
				for range 32768 {
					tb := make([]byte, tokLen)
					for k := range tb {
						tb[k] = byte('a' + rng.IntN(26))
					}
					s.Tokens = append(s.Tokens, rng.IntN(151000))
					s.Logprobs = append(s.Logprobs, -rng.Float64()*5)
					s.TokenBytes = append(s.TokenBytes, tb)
					text = append(text, tb...)
				}
				s.Text = string(text)
				r.Samples = append(r.Samples, s)
			}
			data, err := r.Encode()
			if err != nil {
				t.Fatal(err)
			}
			created := time.Unix(1700000000, 0)
			want, err := r.AppendOpenAI(nil, created)
			if err != nil {
				t.Fatal(err)
			}
			// A line that is not as the worker writes it (here a key that only encoding/json's
			// case folding matches, as another client might write) is decoded whole, still at a
			// bounded cost.
			other := bytes.Replace(data, []byte(`"custom_id"`), []byte(`"Custom_ID"`), 1)
			for _, c := range []struct {
				name  string
				data  []byte
				bound float64
			}{{"as stored", data, 2}, {"in another form", other, 8}} {
				line := make([]byte, 0, len(want)) // submit reuses its line from result to result
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				got, err := resultLine(line, c.data, created, resultOpenAI, r.BatchID, queue.JobKeyOf(r.CustomID))
				runtime.ReadMemStats(&after)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s, %s: the line differs from AppendOpenAI's", format, c.name)
				}
				ratio := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(c.data))
				t.Logf("%s, tokens of %d bytes, %s: stored %d MB, line %d MB, allocated %.2f× the stored size",
					format, tokLen, c.name, len(c.data)>>20, len(want)>>20, ratio)
				if ratio > c.bound {
					t.Errorf("%s, tokens of %d bytes, %s: allocated %.1f× the stored result's %d bytes; want at most %g×",
						format, tokLen, c.name, ratio, len(c.data), c.bound)
				}
			}
		}
	}
}

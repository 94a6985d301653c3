package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestStoredResultThatWouldNotReadBackIsNotWritten: a stored native result is written to -o
// as it is, and the next run reads the file back to resume. One that is not one JSON object
// on one line, starting with its custom_id, of its own job and batch (another client's, or a
// bug's) is refused with an error naming the batch and custom_id, and the file keeps only
// whole results, which a resume reads back. Before, it was written: a raw line break or
// trailing garbage made every later run refuse the file as "not a result", and a payload
// holding two results, or another job's, wrote a job's line twice. An OpenAI line's result,
// written anew from its batch and custom_id, is held to its job and batch too.
func TestStoredResultThatWouldNotReadBackIsNotWritten(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := bind(t, f)
	encode := func(r jobs.Result) string {
		data, err := r.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	result := func(batch, id string) string {
		r := jobs.Result{CustomID: id, BatchID: batch, Status: jobs.StatusOK, Model: "Qwen/Qwen3-8B", Attempts: 1}
		return encode(r)
	}
	// An OpenAI line's result is written anew in the OpenAI format, from its batch and
	// custom_id.
	openAI := func(batch, id string) string {
		r := jobs.Result{CustomID: id, BatchID: batch, Status: jobs.StatusOK, Model: "Qwen/Qwen3-8B", Attempts: 1,
			Format: jobs.FormatOpenAIChat, Samples: []jobs.Sample{{Text: "hi", Tokens: []int{1}, StopReason: jobs.StopReasonStop}}}
		return encode(r)
	}
	for _, c := range []struct {
		name    string
		payload func(batch, id, next string) string // of the second of three jobs
	}{
		{"a line break between members", func(batch, id, _ string) string {
			return strings.Replace(result(batch, id), `,"batch_id"`, ",\n"+`"batch_id"`, 1)
		}},
		{"trailing garbage", func(batch, id, _ string) string { return result(batch, id) + ` x` }},
		{"two results", func(batch, id, next string) string { return result(batch, id) + "\n" + result(batch, next) }},
		{"a space first", func(batch, id, _ string) string { return " " + result(batch, id) }},
		{"another batch's", func(_, id, _ string) string { return result("other", id) }},
		{"another job's", func(batch, _, next string) string { return result(batch, next) }},
		{"an OpenAI line's, of another batch", func(_, id, _ string) string { return openAI("other", id) }},
		{"an OpenAI line's, of another job", func(batch, _, next string) string { return openAI(batch, next) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ids := make([]string, 3)
			lines := make([]string, 3)
			for i := range ids {
				ids[i] = fmt.Sprintf("%s-%d", strings.ReplaceAll(c.name, " ", "-"), i)
				lines[i] = fmt.Sprintf(`{"custom_id":%q,"model":"Qwen/Qwen3-8B","prompt":"hi","sampling_params":{"max_tokens":4}}`, ids[i])
			}
			stdout, _, err := f.submit(ctx, writeLines(t, lines))
			if err != nil {
				t.Fatal(err)
			}
			batch := strings.TrimSpace(stdout)
			first := result(batch, ids[0])
			if strings.Contains(c.name, "OpenAI") {
				first = openAI(batch, ids[0])
			}
			storeResult(ctx, t, q, batch, ids[0], "ok", []byte(first))
			storeResult(ctx, t, q, batch, ids[1], "ok", []byte(c.payload(batch, ids[1], ids[2])))
			storeResult(ctx, t, q, batch, ids[2], "ok", []byte(result(batch, ids[2])))
			out := filepath.Join(t.TempDir(), "out.jsonl")
			for run := range 2 { // the second run resumes the file the first left
				_, _, err := f.submit(ctx, "results", batch, "-o", out)
				if err == nil || !strings.Contains(err.Error(), batch) || !strings.Contains(err.Error(), `custom_id "`+ids[1]+`"`) {
					t.Fatalf("run %d: %v; want an error naming batch %s and custom_id %s", run+1, err, batch, ids[1])
				}
			}
			seen := map[queue.JobKey]bool{}
			o, _, err := openOutput(out, batch, seen, &summary{})
			if err != nil {
				t.Fatalf("the output file does not read back: %v", err)
			}
			o.Close()
			data, _ := os.ReadFile(out)
			if got := strings.Count(string(data), "\n"); got != 1 || !seen[queue.JobKeyOf(ids[0])] {
				t.Errorf("the output file holds %d lines:\n%s\nwant the first result's alone", got, data)
			}
		})
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}

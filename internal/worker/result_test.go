package worker

import (
	"bytes"
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
)

// A sample of no tokens is written with "tokens": [], as the result schema requires, not
// null (a decoded reply leaves an empty token list nil).
func TestASampleOfNoTokensHasAnEmptyTokenList(t *testing.T) {
	job := jobs.Job{CustomID: "c", Model: "Qwen/Qwen3-8B", PromptTokens: []int{1}, NumSamples: 1}
	res := &tinker.SampleResult{Response: &tinker.SampleResponse{
		Sequences: []tinker.SampledSequence{{StopReason: tinker.StopReasonStop}},
	}}
	r := okResult(job, "b", res, 1, nil, tinker.Stop{})
	data, err := r.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"tokens":[]`)) {
		t.Fatalf("result %s: want \"tokens\":[]", data)
	}
}

package worker

import (
	"bytes"
	"context"
	"slices"
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

// A job that asked for OpenAI logprobs gets each sampled token's bytes in its result, the stop
// token's too, which make the sample's text; a job that did not gets none; and without a
// tokenizer (a prompt of token ids) the result still says logprobs were asked for.
func TestOpenAILogprobsCarryTheTokensBytes(t *testing.T) {
	tok, err := builtinTokens().ForModel(context.Background(), "Qwen/Qwen3-8B")
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode("Hi 𝔘!") // "𝔘" is two tokens, each a part of its UTF-8 bytes
	seq := tinker.SampledSequence{Tokens: append(slices.Clone(ids), 151645), StopReason: tinker.StopReasonStop}
	res := &tinker.SampleResult{Response: &tinker.SampleResponse{Sequences: []tinker.SampledSequence{seq}}}
	job := jobs.Job{CustomID: "c", Format: jobs.FormatOpenAIChat, Model: "Qwen/Qwen3-8B",
		Messages: []jobs.Message{{Role: jobs.RoleUser, Content: "x"}}, NumSamples: 1, OpenAILogprobs: true}
	stop := tinker.Stop{Tokens: []int{151645}}

	r := okResult(job, "b", res, 1, tok, stop)
	s := r.Samples[0]
	if !r.OpenAILogprobs || len(s.TokenBytes) != len(seq.Tokens) || s.Text != "Hi 𝔘!" {
		t.Fatalf("result %+v", r)
	}
	var all []byte
	for i, b := range s.TokenBytes {
		if want := tok.AppendTokenBytes(nil, seq.Tokens[i]); !bytes.Equal(b, want) {
			t.Errorf("bytes of token %d (%d): %q, want %q", i, seq.Tokens[i], b, want)
		}
		all = append(all, b...)
	}
	if string(all) != s.Text+"<|im_end|>" {
		t.Errorf("the tokens' bytes make %q, not the text and its stop token", all)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}

	job.OpenAILogprobs = false
	if r := okResult(job, "b", res, 1, tok, stop); r.OpenAILogprobs || r.Samples[0].TokenBytes != nil {
		t.Errorf("a job that did not ask has token bytes: %+v", r)
	}
	job.OpenAILogprobs, job.Messages, job.PromptTokens = true, nil, []int{1}
	if r := okResult(job, "b", res, 1, nil, tinker.Stop{}); !r.OpenAILogprobs || r.Samples[0].TokenBytes != nil {
		t.Errorf("without a tokenizer: %+v", r)
	}
}

// A dead letter and a cancelled job's result are named by the message's custom id header, as
// its other results are: a message whose line names another job (from a publisher other than
// submit) took that job's result subject, and the job's own result was then refused.
func TestEndedUnsampledJobsAreNamedByTheirHeader(t *testing.T) {
	data := []byte(`{"custom_id":"line-id","model":"Qwen/Qwen3-8B","prompt":"hi"}`)
	for name, res := range map[string]jobs.Result{
		"dead letter": deadLetterResult(data, "b", "header-id", "gave up"),
		"cancelled":   cancelledResult(data, "b", "header-id"),
	} {
		if res.CustomID != "header-id" {
			t.Errorf("%s: custom_id %q, want the header's %q", name, res.CustomID, "header-id")
		}
	}
	// Without a header, the line names it.
	if res := deadLetterResult(data, "b", "", "gave up"); res.CustomID != "line-id" {
		t.Errorf("no header: custom_id %q, want the line's", res.CustomID)
	}
}

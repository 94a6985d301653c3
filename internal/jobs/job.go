package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Formats a job can come from (Job.Format).
const (
	// FormatNative is the tinkerfleet job line (schemas/job.schema.json, "native").
	FormatNative = "tinkerfleet"
	// FormatOpenAICompletions is an OpenAI Batch API line with url /v1/completions.
	FormatOpenAICompletions = "openai-completions"
	// FormatOpenAIChat is an OpenAI Batch API line with url /v1/chat/completions.
	FormatOpenAIChat = "openai-chat"
)

// Message roles accepted in Job.Messages.
const (
	RoleAssistant = "assistant"
	RoleSystem    = "system"
	RoleTool      = "tool"
	RoleUser      = "user"
)

// Job is one sampling request in normalized form, whatever line format it was read from. Its JSON
// encoding (Encode) is the body of the NATS job message; DecodeJob reads it back.
type Job struct {
	// CustomID identifies the job within its batch; results carry it back.
	CustomID string
	// Format says which line format the job was read from (FormatNative, FormatOpenAIChat or
	// FormatOpenAICompletions); "" is treated as FormatNative.
	Format string
	// Messages is a chat prompt, rendered with the model's chat template by the worker.
	Messages []Message
	// Thinking turns on the chat template's thinking switch (Qwen3's enable_thinking,
	// DeepSeek V3.1's thinking), which is off by default. It applies to Messages only; a
	// model whose template has no switch (Llama 3, the Qwen3 Instruct models) ignores it, and
	// gpt-oss, which always reasons, refuses it.
	Thinking bool
	// ReasoningEffort is how hard gpt-oss reasons before it answers: "low", "medium" or
	// "high" ("": medium, its chat template's default). It applies to gpt-oss's Messages only.
	ReasoningEffort string
	// Metadata is any JSON value, copied byte for byte from the input line into the result line.
	// Nil when the line had none.
	Metadata json.RawMessage
	// Model is a base model name such as "Qwen/Qwen3-8B". Exactly one of Model and ModelPath is set.
	Model string
	// ModelPath is a sampler checkpoint, "tinker://…" (§3.5).
	ModelPath string
	// NumSamples is the number of independent completions of the prompt (§3.6 num_samples); the
	// readers set it to 1 when the line does not say.
	NumSamples int
	// Params are the sampling parameters (§T2).
	Params SamplingParams
	// Prompt is a plain text prompt, tokenized by the worker without a chat template.
	Prompt string
	// PromptLogprobs asks for the log-probability of every prompt token (§3.6).
	PromptLogprobs bool
	// PromptTokens is a prompt given as token ids, sent as they are (§T1 encoded_text).
	PromptTokens []int
	// TopKPromptLogprobs asks for the k most likely tokens at every prompt position, 0..20 (§3.6).
	TopKPromptLogprobs int
}

// Message is one turn of a chat prompt.
type Message struct {
	// Role is one of RoleSystem, RoleUser, RoleAssistant, RoleTool.
	Role string `json:"role"`
	// Content is the text of the turn (OpenAI text content parts are joined with "\n").
	Content string `json:"content"`
}

// SamplingParams are the optional sampling parameters of §T2; nil means "not set" (the worker
// sends the §T2 defaults for temperature, top_p and top_k).
type SamplingParams struct {
	// MaxTokens is the most tokens to generate per sample, >= 1.
	MaxTokens *int `json:"max_tokens,omitempty"`
	// Seed makes sampling reproducible; any int64 (the server folds it, §T2).
	Seed *int64 `json:"seed,omitempty"`
	// Stop ends a sample at any of these strings or token ids.
	Stop Stop `json:"stop,omitzero"`
	// Temperature is >= 0; 0 is greedy.
	Temperature *float64 `json:"temperature,omitempty"`
	// TopK is -1 (no limit) or >= 1.
	TopK *int `json:"top_k,omitempty"`
	// TopP is in (0, 1].
	TopP *float64 `json:"top_p,omitempty"`
}

// Stop is a list of stop strings or a list of stop token ids, never both (§T2). A single stop
// string in the input becomes a one-element Strings.
type Stop struct {
	// Strings are stop strings (non-empty).
	Strings []string
	// TokenIDs are stop token ids.
	TokenIDs []int
}

// IsZero reports whether no stop condition is set.
func (s Stop) IsZero() bool { return len(s.Strings) == 0 && len(s.TokenIDs) == 0 }

// MarshalJSON writes a list of strings or a list of token ids (strings win if, wrongly, both are
// set; Validate rejects that).
func (s Stop) MarshalJSON() ([]byte, error) {
	if len(s.Strings) > 0 {
		return marshalNoEscape(s.Strings)
	}
	if len(s.TokenIDs) > 0 {
		return json.Marshal(s.TokenIDs)
	}
	return []byte("null"), nil
}

// UnmarshalJSON accepts a string, a list of strings or a list of token ids.
func (s *Stop) UnmarshalJSON(b []byte) error {
	if !json.Valid(b) {
		return fmt.Errorf("stop: malformed JSON")
	}
	st, fe := parseStop(bytes.TrimSpace(b), "stop")
	if fe != nil {
		return fe
	}
	*s = st
	return nil
}

// wireJob is the JSON shape of a Job (the native line plus "format"); metadata is spliced in by
// encodeWithMetadata so that it stays byte for byte.
type wireJob struct {
	CustomID           string          `json:"custom_id"`
	Format             string          `json:"format,omitempty"`
	Model              string          `json:"model,omitempty"`
	ModelPath          string          `json:"model_path,omitempty"`
	Prompt             *string         `json:"prompt,omitempty"`
	PromptTokens       []int           `json:"prompt_tokens,omitempty"`
	Messages           []Message       `json:"messages,omitempty"`
	Thinking           bool            `json:"thinking,omitempty"`
	ReasoningEffort    string          `json:"reasoning_effort,omitempty"`
	Params             *SamplingParams `json:"sampling_params,omitempty"`
	NumSamples         int             `json:"num_samples"`
	PromptLogprobs     bool            `json:"prompt_logprobs,omitempty"`
	TopKPromptLogprobs int             `json:"topk_prompt_logprobs,omitempty"`
}

// Encode returns the compact JSON form of the job (the NATS message body). Metadata is written
// byte for byte; only if it contains a newline is it compacted, to keep the encoding on one line.
func (j Job) Encode() ([]byte, error) {
	w := wireJob{
		CustomID:           j.CustomID,
		Format:             j.Format,
		Model:              j.Model,
		ModelPath:          j.ModelPath,
		PromptTokens:       j.PromptTokens,
		Messages:           j.Messages,
		Thinking:           j.Thinking,
		ReasoningEffort:    j.ReasoningEffort,
		NumSamples:         j.NumSamples,
		PromptLogprobs:     j.PromptLogprobs,
		TopKPromptLogprobs: j.TopKPromptLogprobs,
	}
	if j.Prompt != "" {
		w.Prompt = &j.Prompt
	}
	if !j.Params.isZero() {
		w.Params = &j.Params
	}
	b, err := encodeWithMetadata(w, j.Metadata)
	if err != nil {
		return nil, fmt.Errorf("encode job %q: %w", j.CustomID, err)
	}
	return b, nil
}

// MarshalJSON is Encode, so a Job embedded in other JSON keeps its metadata byte for byte as far
// as the outer encoder allows (encoding/json compacts what a Marshaler returns).
func (j Job) MarshalJSON() ([]byte, error) { return j.Encode() }

// UnmarshalJSON is DecodeJob.
func (j *Job) UnmarshalJSON(b []byte) error {
	d, err := DecodeJob(b)
	if err != nil {
		return err
	}
	*j = d
	return nil
}

// DecodeJob reads a job encoded by Encode. It is as strict about types and unknown fields as the
// line reader (a message from a newer or foreign producer is rejected, not half-understood), but
// it does not apply Limits: call Validate for that.
func DecodeJob(data []byte) (Job, error) {
	b := bytes.TrimSpace(data)
	if fe := checkSyntax(b); fe != nil {
		return Job{}, fmt.Errorf("decode job: %w", fe)
	}
	j, fe := parseNativeJob(b, true)
	if fe != nil {
		return Job{}, fmt.Errorf("decode job: %w", fe)
	}
	return j, nil
}

// isZero reports whether no sampling parameter is set.
func (p SamplingParams) isZero() bool {
	return p.MaxTokens == nil && p.Seed == nil && p.Temperature == nil && p.TopK == nil &&
		p.TopP == nil && p.Stop.IsZero()
}

// encodeWithMetadata marshals v (a struct encoding to a JSON object) without HTML escaping and
// appends "metadata": raw before the closing brace, raw kept byte for byte unless it holds a
// newline (then it is compacted).
func encodeWithMetadata(v any, raw json.RawMessage) ([]byte, error) {
	b, err := marshalNoEscape(v)
	if err != nil {
		return nil, err
	}
	if raw == nil {
		return b, nil
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("metadata is not valid JSON")
	}
	if bytes.IndexByte(raw, '\n') >= 0 {
		var c bytes.Buffer
		if err := json.Compact(&c, raw); err != nil {
			return nil, fmt.Errorf("compact metadata: %w", err)
		}
		raw = c.Bytes()
	}
	out := make([]byte, 0, len(b)+len(raw)+12)
	out = append(out, b[:len(b)-1]...)
	if len(b) > 2 {
		out = append(out, ',')
	}
	out = append(out, `"metadata":`...)
	out = append(out, raw...)
	out = append(out, '}')
	return out, nil
}

// marshalNoEscape is json.Marshal without HTML escaping (so "<|im_end|>" stays readable).
func marshalNoEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
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
	// OpenAILogprobs says that an OpenAI line asked for the sampled tokens' logprobs (chat
	// "logprobs": true, completions "logprobs": 0): its result then carries each sampled
	// token's bytes (Sample.TokenBytes), which the "logprobs" of its OpenAI-format line need
	// (AppendOpenAI). Encoded as "openai_logprobs"; a native line has no such field.
	OpenAILogprobs bool
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

// Encode returns the compact JSON form of the job (the NATS message body): AppendJSON into a
// new buffer.
func (j Job) Encode() ([]byte, error) {
	return j.AppendJSON(make([]byte, 0, j.encodedSizeHint()))
}

// AppendJSON appends the compact one-line JSON of the job to b: the native line's fields (the
// zero ones left out) and "format", as encoding/json writes them with HTML escaping off, and
// the metadata last, byte for byte (compacted only if it holds a newline, to keep one line).
// submit encodes one job per input line, so this is written out by hand rather than through
// reflection (bench comparison 4); TestJobAppendJSONMatchesEncodingJSON and FuzzJobJSON hold it
// to encoding/json's output, byte for byte.
func (j *Job) AppendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"custom_id":`...)
	b = appendJSONString(b, j.CustomID)
	b = appendStringField(b, `,"format":`, j.Format)
	b = appendStringField(b, `,"model":`, j.Model)
	b = appendStringField(b, `,"model_path":`, j.ModelPath)
	b = appendStringField(b, `,"prompt":`, j.Prompt)
	if len(j.PromptTokens) > 0 {
		b = append(b, `,"prompt_tokens":`...)
		b = appendInts(b, j.PromptTokens)
	}
	if len(j.Messages) > 0 {
		b = append(b, `,"messages":[`...)
		for i, m := range j.Messages {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"role":`...)
			b = appendJSONString(b, m.Role)
			b = append(b, `,"content":`...)
			b = appendJSONString(b, m.Content)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if j.Thinking {
		b = append(b, `,"thinking":true`...)
	}
	b = appendStringField(b, `,"reasoning_effort":`, j.ReasoningEffort)
	if !j.Params.isZero() {
		var err error
		if b, err = j.Params.appendJSON(append(b, `,"sampling_params":`...)); err != nil {
			return nil, fmt.Errorf("encode job %q: %w", j.CustomID, err)
		}
	}
	b = append(b, `,"num_samples":`...)
	b = strconv.AppendInt(b, int64(j.NumSamples), 10)
	if j.PromptLogprobs {
		b = append(b, `,"prompt_logprobs":true`...)
	}
	if j.TopKPromptLogprobs != 0 {
		b = append(b, `,"topk_prompt_logprobs":`...)
		b = strconv.AppendInt(b, int64(j.TopKPromptLogprobs), 10)
	}
	if j.OpenAILogprobs {
		b = append(b, `,"openai_logprobs":true`...)
	}
	if j.Metadata != nil {
		var err error
		if b, err = appendMetadata(b, j.Metadata); err != nil {
			return nil, fmt.Errorf("encode job %q: %w", j.CustomID, err)
		}
	}
	return append(b, '}'), nil
}

// encodedSizeHint is about the size of the job's encoding, so that Encode allocates once.
func (j *Job) encodedSizeHint() int {
	n := 160 + len(j.CustomID) + len(j.Model) + len(j.ModelPath) + len(j.Prompt) + 8*len(j.PromptTokens) + len(j.Metadata)
	for _, m := range j.Messages {
		n += 32 + len(m.Content)
	}
	return n
}

// appendStringField appends key and s as a JSON string, unless s is empty (omitempty).
func appendStringField(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendJSONString(append(b, key...), s)
}

// appendInts appends a JSON list of integers.
func appendInts(b []byte, xs []int) []byte {
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return append(b, ']')
}

// appendJSON appends the parameters as a JSON object: the fields set, in the order of the
// struct (as encoding/json writes them).
func (p *SamplingParams) appendJSON(b []byte) ([]byte, error) {
	b = append(b, '{')
	key := func(k string) {
		if b[len(b)-1] != '{' {
			b = append(b, ',')
		}
		b = append(b, k...)
	}
	if p.MaxTokens != nil {
		key(`"max_tokens":`)
		b = strconv.AppendInt(b, int64(*p.MaxTokens), 10)
	}
	if p.Seed != nil {
		key(`"seed":`)
		b = strconv.AppendInt(b, *p.Seed, 10)
	}
	if len(p.Stop.Strings) > 0 {
		key(`"stop":[`)
		for i, s := range p.Stop.Strings {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, s)
		}
		b = append(b, ']')
	} else if len(p.Stop.TokenIDs) > 0 {
		key(`"stop":`)
		b = appendInts(b, p.Stop.TokenIDs)
	}
	var err error
	if p.Temperature != nil {
		key(`"temperature":`)
		if b, err = appendFloat64(b, *p.Temperature); err != nil {
			return nil, err
		}
	}
	if p.TopK != nil {
		key(`"top_k":`)
		b = strconv.AppendInt(b, int64(*p.TopK), 10)
	}
	if p.TopP != nil {
		key(`"top_p":`)
		if b, err = appendFloat64(b, *p.TopP); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// appendFloat64 appends f as encoding/json writes a float64: the shortest form that reads
// back the same, in exponent form below 1e-6 and from 1e21 on, with a one-digit negative
// exponent written without its leading zero. NaN and infinities are not JSON.
func appendFloat64(b []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("unsupported value %v", f)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-07 -> e-7, as encoding/json does.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
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

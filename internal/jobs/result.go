package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/tinkerfleet/tinkerfleet/internal/ftoa"
)

// Status is the outcome of a job in its result line.
type Status string

// The three outcomes; every accepted job ends with exactly one result line carrying one of them.
const (
	StatusCancelled Status = "cancelled"
	StatusError     Status = "error"
	StatusOK        Status = "ok"
)

// Category says whose fault a failure is, with the wire values of the SDK's
// RequestErrorCategory (§7.2).
type Category string

// Failure categories (§7.2); anything unrecognised is CategoryUnknown.
const (
	CategoryServer  Category = "server"
	CategoryUnknown Category = "unknown"
	CategoryUser    Category = "user"
)

// Error codes of ResultError.Code.
const (
	// CodeAPIError: the Tinker API refused the request with a non-retryable HTTP status
	// (400/404/422, §6.1, §7.1), or with a 403 while it accepts the key itself (a 401, or a 403
	// to the key, stops the worker instead, and the job waits for another).
	CodeAPIError = "api_error"
	// CodeCancelled: the batch was cancelled before the job was sampled.
	CodeCancelled = "cancelled"
	// CodeContextTooLong: prompt tokens + max_tokens exceed the model's context window.
	CodeContextTooLong = "context_too_long"
	// CodeDeadLetter: the job was delivered the maximum number of times without a result
	// (workers crashed on it, or its failures were all worth another try: a sample the
	// service failed or did not answer within the worker's sample timeout, a 402 past the
	// billing window).
	CodeDeadLetter = "dead_letter"
	// CodeFailedFuture: the sampling future completed with a RequestFailedResponse (§T5, §7.2);
	// the SDK never retries these.
	CodeFailedFuture = "failed_future"
	// CodeInternal: a tinkerfleet bug (a worker's panic on the job, category unknown), or a
	// result too large to store (category user: the job asked for it).
	CodeInternal = "internal"
	// CodeInvalidJob: the job failed validation in the worker (or could not be decoded).
	CodeInvalidJob = "invalid_job"
	// CodeRateLimited is reserved (result.schema.json has it; AppendOpenAI writes it as a
	// 429): no worker of this version ends a job with it. A 429 pauses the fleet and is tried
	// again for as long as it lasts; a 402 past the billing window (§2.3) is a failure worth
	// another try, and the job's last ends as CodeDeadLetter.
	CodeRateLimited = "rate_limited"
	// CodeTimeout is reserved (result.schema.json has it): no worker of this version ends a
	// job with it. A sample without progress (§6.3) or past the worker's sample timeout is
	// tried again, and the job's last try ends as CodeDeadLetter.
	CodeTimeout = "timeout"
	// CodeTokenize: the prompt could not be tokenized or rendered with the chat template.
	CodeTokenize = "tokenize_failed"
)

// Stop reasons of a Sample (§T3).
const (
	StopReasonLength = "length"
	StopReasonStop   = "stop"
)

// Result is one result line (schemas/result.schema.json), also the body of a RESULTS message.
type Result struct {
	// CustomID is the job's custom_id.
	CustomID string `json:"custom_id"`
	// BatchID is the batch the job belongs to.
	BatchID string `json:"batch_id"`
	// Status is ok, error or cancelled.
	Status Status `json:"status"`
	// Model is the job's model, or its model_path.
	Model string `json:"model,omitempty"`
	// Format is the line format of the job when it is not native: FormatOpenAIChat or
	// FormatOpenAICompletions, so that submit can write the result in the OpenAI Batch output
	// format (AppendOpenAI); "" for native jobs (see ResultFormat).
	Format string `json:"format,omitempty"`
	// OpenAILogprobs says that the job asked for the sampled tokens' logprobs in its
	// OpenAI-format line (Job.OpenAILogprobs); set on ok results only. Its samples then carry
	// TokenBytes, unless the worker had no tokenizer for the model (a prompt of token ids).
	OpenAILogprobs bool `json:"openai_logprobs,omitempty"`
	// Samples are the completions (num_samples of them) when Status is ok.
	Samples []Sample `json:"samples,omitempty"`
	// PromptLogprobs has one entry per prompt token when the job asked for prompt_logprobs; NaN
	// (written as null) where not computed, always at position 0 (§T3).
	PromptLogprobs Logprobs `json:"prompt_logprobs,omitempty"`
	// TopKPromptLogprobs has one entry per prompt position when topk_prompt_logprobs > 0: nil
	// (null) or up to k (token, logprob) pairs (§T3).
	TopKPromptLogprobs [][]TokenLogprob `json:"topk_prompt_logprobs,omitempty"`
	// Usage counts tokens; set for ok results.
	Usage *Usage `json:"usage,omitempty"`
	// Error describes the failure when Status is error or cancelled.
	Error *ResultError `json:"error,omitempty"`
	// Attempts is the number of sampling attempts (§6.3) the delivery that ended the job made:
	// 0 when it sent none (an invalid job, a cancelled one, a dead letter).
	Attempts int `json:"attempts"`
	// LatencyMS is the time from the worker taking the job to the result, in milliseconds.
	LatencyMS int64 `json:"latency_ms"`
	// Metadata is the job's metadata, byte for byte.
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// Sample is one completion.
type Sample struct {
	// Text is the decoded completion.
	Text string `json:"text"`
	// Tokens are the sampled token ids.
	Tokens []int `json:"tokens"`
	// Logprobs holds the log-probability of each sampled token (same length as Tokens), or nil
	// when the service returned none.
	Logprobs Logprobs `json:"logprobs,omitempty"`
	// TokenBytes holds the bytes of each sampled token (same length as Tokens) when the job
	// asked for logprobs in OpenAI's format (Result.OpenAILogprobs), nil otherwise.
	TokenBytes TokenBytes `json:"token_bytes,omitempty"`
	// StopReason is StopReasonStop or StopReasonLength.
	StopReason string `json:"stop_reason"`
}

// Usage counts the tokens of one job.
type Usage struct {
	// PromptTokens is the prompt length in tokens.
	PromptTokens int `json:"prompt_tokens"`
	// CompletionTokens is the sum of the samples' lengths.
	CompletionTokens int `json:"completion_tokens"`
	// CacheHitTokens are prompt tokens billed as prefix-cache hits (§T3 prompt_cache_hit_tokens).
	CacheHitTokens int `json:"cache_hit_tokens"`
}

// ResultError describes why a job has no samples.
type ResultError struct {
	// Code is one of the Code* constants.
	Code string `json:"code"`
	// Message is a human-readable explanation (never contains credentials).
	Message string `json:"message"`
	// Category says whose fault it is (§7.2).
	Category Category `json:"category"`
	// Retryable says whether resubmitting the same job may succeed.
	Retryable bool `json:"retryable"`
}

// Error returns "code: message", so a ResultError can travel as an error.
func (e ResultError) Error() string { return e.Code + ": " + e.Message }

// TokenLogprob is a (token id, logprob) pair, written as a two-element JSON array [id, logprob]
// (the logprob as in Logprobs: null for NaN, read back as NaN).
type TokenLogprob struct {
	// Token is the token id.
	Token int
	// Logprob is its log-probability.
	Logprob float64
}

// MarshalJSON writes [token, logprob].
func (t TokenLogprob) MarshalJSON() ([]byte, error) {
	b := append([]byte{'['}, strconv.Itoa(t.Token)...)
	b = append(b, ',')
	b = appendLogprob(b, t.Logprob)
	return append(b, ']'), nil
}

// UnmarshalJSON reads [token, logprob].
func (t *TokenLogprob) UnmarshalJSON(b []byte) error {
	var pair []json.Number
	if err := json.Unmarshal(b, &pair); err != nil || len(pair) != 2 {
		return fmt.Errorf("token logprob must be a [token_id, logprob] pair")
	}
	tok, err := pair[0].Int64()
	if err != nil {
		return fmt.Errorf("token logprob: token id: %w", err)
	}
	lp := math.NaN() // null: the service sent NaN (MarshalJSON)
	if pair[1] != "" {
		if lp, err = pair[1].Float64(); err != nil {
			return fmt.Errorf("token logprob: logprob: %w", err)
		}
	}
	t.Token, t.Logprob = int(tok), lp
	return nil
}

// TokenBytes are the bytes of a sample's tokens, one list per token: what the token stands for
// in the tokenizer's byte-level vocabulary (tokenizer.AppendTokenBytes), which may be a part of
// a UTF-8 sequence, so not valid UTF-8 alone. It is written as a JSON list of lists of
// integers 0..255, as OpenAI writes a token's "bytes".
type TokenBytes [][]byte

// MarshalJSON writes [[b, …], …].
func (t TokenBytes) MarshalJSON() ([]byte, error) {
	if t == nil {
		return []byte("null"), nil
	}
	return t.appendJSON(make([]byte, 0, 2+len(t)*16)), nil
}

// UnmarshalJSON reads a list of lists of integers 0..255.
func (t *TokenBytes) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		*t = nil
		return nil
	}
	if validJSON(b) {
		// Read in place, as the worker writes them: through [][]int, a token of one byte took
		// 40 bytes or more, and a sample's lists 10 times their JSON.
		if n, ok := scanTokenBytes(b); ok && n >= 0 {
			*t = decodeTokenBytes(nil, b, n)
			return nil
		}
	}
	var raw [][]int
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("token bytes: %w", err)
	}
	n := 0
	for _, tok := range raw {
		n += len(tok)
	}
	buf := make([]byte, 0, n) // one allocation for the bytes of every token
	out := make(TokenBytes, len(raw))
	for i, tok := range raw {
		start := len(buf)
		for _, c := range tok {
			if c < 0 || c > 255 {
				return fmt.Errorf("token bytes: %d is not a byte", c)
			}
			buf = append(buf, byte(c))
		}
		out[i] = buf[start:len(buf):len(buf)]
	}
	*t = out
	return nil
}

// appendJSON writes the lists (see MarshalJSON).
func (t TokenBytes) appendJSON(b []byte) []byte {
	b = append(b, '[')
	for i, tok := range t {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendByteList(b, tok)
	}
	return append(b, ']')
}

// appendByteList appends bs as a JSON list of integers.
func appendByteList(b, bs []byte) []byte {
	b = append(b, '[')
	for i, c := range bs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(c), 10)
	}
	return append(b, ']')
}

// Logprobs is a list of log-probabilities in which NaN marks a missing value (§T4). It is written
// as a JSON array with null for NaN, with float32 precision (the service computes float32, §T4),
// and ±Inf, or any value past float32's range, as ±3.4028235e+38; null elements read back as
// NaN.
type Logprobs []float64

// MarshalJSON writes the list with null for NaN.
func (l Logprobs) MarshalJSON() ([]byte, error) {
	if l == nil {
		return []byte("null"), nil
	}
	b := make([]byte, 0, 2+len(l)*10)
	b = append(b, '[')
	for i, f := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendLogprob(b, f)
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads a list of numbers and nulls.
func (l *Logprobs) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		*l = nil
		return nil
	}
	if validJSON(b) {
		// Read in place (numbers and nulls): through []*float64, each took 24 bytes more.
		if n, ok := scanLogprobs(b); ok && n >= 0 {
			*l = decodeLogprobs(nil, b, n)
			return nil
		}
	}
	var raw []*float64
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("logprobs: %w", err)
	}
	out := make(Logprobs, len(raw))
	for i, p := range raw {
		if p == nil {
			out[i] = math.NaN()
		} else {
			out[i] = *p
		}
	}
	*l = out
	return nil
}

// appendLogprob appends one logprob as JSON. A value that float32 cannot hold, an infinity
// or a finite number past its range (a JSON reply may send any float64), is float32's
// extreme: written at float32 precision it would be "+Inf", which is no JSON.
func appendLogprob(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, "null"...)
	case f >= math.MaxFloat32:
		return append(b, "3.4028235e+38"...)
	case f <= -math.MaxFloat32:
		return append(b, "-3.4028235e+38"...)
	}
	return ftoa.AppendFloat32(b, float32(f)) // strconv's 'g' at 32 bits, in half its time
}

// ResultFormat is the Result.Format of a job read from the line format jobFormat (Job.Format):
// FormatOpenAIChat and FormatOpenAICompletions as they are, "" for native jobs and anything else.
func ResultFormat(jobFormat string) string {
	switch jobFormat {
	case FormatOpenAIChat, FormatOpenAICompletions:
		return jobFormat
	}
	return ""
}

// FormatOfResult returns the format of an encoded result (AppendJSON's output) without
// decoding it: it reads the top-level keys only up to "format", which AppendJSON writes before
// any list and before the metadata. It returns "" for a native result and for data that is
// not a result object.
func FormatOfResult(data []byte) string {
	if !isObject(data) {
		return ""
	}
	it := newObjIter(data)
	for k, v, ok := it.next(); ok; k, v, ok = it.next() {
		switch string(k) {
		case "custom_id", "batch_id", "status", "model":
			continue
		case "format":
			var f string
			if json.Unmarshal(v, &f) != nil {
				return ""
			}
			return ResultFormat(f)
		}
		return ""
	}
	return ""
}

// ResultLineIDs returns the custom_id and batch_id of data, a result line as AppendJSON
// writes one and a reader of an output file takes it back: one JSON object on one line (no
// line break, even between its members, and nothing but white space after it), starting with
// its custom_id (valid UTF-8), with a batch_id and a status that are strings. ok is false for
// anything else. It costs one pass over data (validJSON) and a look at its first members:
// submit runs it on every result it writes as stored.
func ResultLineIDs(data []byte) (customID, batchID string, ok bool) {
	if !bytes.HasPrefix(data, []byte(`{"custom_id":`)) || bytes.IndexByte(data, '\n') >= 0 || !validJSON(data) {
		return "", "", false
	}
	var haveID, haveBatch, haveStatus bool
	it := newObjIter(data)
	for k, v, more := it.next(); more && !(haveID && haveBatch && haveStatus); k, v, more = it.next() {
		var s string
		switch string(k) {
		case "custom_id":
			s, ok = decString(v)
			customID, haveID = s, ok && s != "" && utf8.ValidString(s)
		case "batch_id":
			batchID, haveBatch = decString(v)
		case "status":
			s, ok = decString(v)
			haveStatus = ok && s != ""
		}
	}
	if !haveID || !haveBatch || !haveStatus {
		return "", "", false
	}
	return customID, batchID, true
}

// NewResult starts a result for j: custom_id, batch id, model, format and metadata filled in,
// status ok.
func NewResult(j Job, batchID string) Result {
	model := j.Model
	if model == "" {
		model = j.ModelPath
	}
	return Result{
		CustomID: j.CustomID,
		BatchID:  batchID,
		Status:   StatusOK,
		Model:    model,
		Format:   ResultFormat(j.Format),
		Metadata: j.Metadata,
	}
}

// ErrorResult is the result of a job that failed with e.
func ErrorResult(j Job, batchID string, e ResultError) Result {
	r := NewResult(j, batchID)
	r.Status = StatusError
	r.Error = &e
	return r
}

// CancelledResult is the result of a job whose batch was cancelled before it was sampled.
func CancelledResult(j Job, batchID, reason string) Result {
	r := NewResult(j, batchID)
	r.Status = StatusCancelled
	if reason == "" {
		reason = "batch cancelled"
	}
	r.Error = &ResultError{Code: CodeCancelled, Message: reason, Category: CategoryUser}
	return r
}

// InvalidJobResult is the result for a job message the worker could not decode or validate; err
// is typically a *FieldError from DecodeJob or Validate.
func InvalidJobResult(j Job, batchID string, err error) Result {
	return ErrorResult(j, batchID, ResultError{
		Code: CodeInvalidJob, Message: err.Error(), Category: CategoryUser,
	})
}

// resultNoMethods has Result's fields without its methods, for the default JSON decoder.
type resultNoMethods Result

// Encode returns the compact one-line JSON of the result; metadata is written byte for byte
// (compacted only if it contains a newline).
func (r Result) Encode() ([]byte, error) {
	b, err := r.AppendJSON(make([]byte, 0, 512))
	if err != nil {
		return nil, fmt.Errorf("encode result %q: %w", r.CustomID, err)
	}
	return b, nil
}

// MarshalJSON is Encode.
func (r Result) MarshalJSON() ([]byte, error) { return r.Encode() }

// DecodeResult reads one result line and checks it with Validate.
func DecodeResult(data []byte) (Result, error) {
	var r resultNoMethods
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		if msg := err.Error(); len(msg) > MaxExcerpt {
			// encoding/json names an unknown field whole, and a key may be megabytes long.
			return Result{}, fmt.Errorf("decode result: %s", Clip(msg))
		}
		return Result{}, fmt.Errorf("decode result: %w", err)
	}
	res := Result(r)
	if err := res.Validate(); err != nil {
		return Result{}, fmt.Errorf("decode result: %w", err)
	}
	return res, nil
}

// Validate checks the invariants of a result line: a custom_id, a known status and format, an
// error for failures and none for successes.
func (r *Result) Validate() error {
	if r.CustomID == "" {
		return fieldErr("custom_id", "must not be empty")
	}
	if r.Format != "" && ResultFormat(r.Format) != r.Format {
		return fieldErr("format", `must be "`+FormatOpenAIChat+`" or "`+FormatOpenAICompletions+`" when present`)
	}
	switch r.Status {
	case StatusOK:
		if r.Error != nil {
			return fieldErr("error", `must be absent when status is "ok"`)
		}
	case StatusError, StatusCancelled:
		if r.Error == nil {
			return fieldErr("error", "is required when status is "+string(r.Status))
		}
		switch r.Error.Category {
		case CategoryUser, CategoryServer, CategoryUnknown:
		default:
			return fieldErr("error.category", "must be user, server or unknown")
		}
	default:
		return fieldErr("status", `must be "ok", "error" or "cancelled"`)
	}
	for i, s := range r.Samples {
		logprobs, tokenBytes := -1, -1
		if s.Logprobs != nil {
			logprobs = len(s.Logprobs)
		}
		if s.TokenBytes != nil {
			tokenBytes = len(s.TokenBytes)
		}
		if err := validateSample(i, s.StopReason, len(s.Tokens), logprobs, tokenBytes); err != nil {
			return err
		}
	}
	return nil
}

// validateSample checks sample i of a result (see Validate) from its stop reason and the
// lengths of its lists: logprobs and tokenBytes are -1 when the sample has none (nil).
func validateSample(i int, stopReason string, tokens, logprobs, tokenBytes int) error {
	if stopReason != StopReasonStop && stopReason != StopReasonLength {
		return fieldErr("samples["+strconv.Itoa(i)+"].stop_reason", `must be "stop" or "length"`)
	}
	if logprobs >= 0 && logprobs != tokens {
		return fieldErr("samples["+strconv.Itoa(i)+"].logprobs", "must have one entry per token")
	}
	if tokenBytes >= 0 && tokenBytes != tokens {
		return fieldErr("samples["+strconv.Itoa(i)+"].token_bytes", "must have one entry per token")
	}
	return nil
}

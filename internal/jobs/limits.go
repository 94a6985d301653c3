package jobs

// Defaults applied to zero (or negative) Limits fields.
const (
	// DefaultMaxLineBytes bounds one JSONL line (without its line end): 8 MiB, the largest
	// message of the embedded NATS server and deploy/'s. A prompt at MaxPromptChars fits in it
	// however it is escaped (Python's json.dumps writes each non-ASCII character of the BMP
	// as a 6-byte \uXXXX), so the prompt limit, not the line's, is the one a user meets.
	DefaultMaxLineBytes = 8 << 20
	// DefaultMaxPromptChars bounds the prompt text in Unicode code points (for messages: the sum of
	// all contents). One million is far above any context window we sample with; it exists to stop
	// pathological lines early, the worker's context check after tokenizing is the real bound.
	DefaultMaxPromptChars = 1_000_000
	// DefaultMaxPromptTokens bounds prompt_tokens: 131072, the largest context window among the
	// base models Tinker serves. The worker checks the model's own window after tokenizing.
	DefaultMaxPromptTokens = 131072
	// DefaultMaxNumSamples bounds num_samples (OpenAI n). All samples of a job travel back in one
	// result message, so num_samples × max_tokens decides its size; 16 covers typical GRPO group
	// sizes while keeping a result of 16 × 4096 tokens near 1.5 MB of JSON.
	DefaultMaxNumSamples = 16
	// DefaultMaxMaxTokens bounds sampling_params.max_tokens (OpenAI max_tokens /
	// max_completion_tokens): 32768.
	DefaultMaxMaxTokens = 32768
	// DefaultMaxCustomIDLen bounds custom_id in bytes. The id is part of the NATS message id
	// (<batch>/<custom_id>), so it is kept short.
	DefaultMaxCustomIDLen = 256
	// DefaultMaxMetadataBytes bounds the raw metadata value, which is copied into the job message
	// and again into the result line.
	DefaultMaxMetadataBytes = 64 << 10
	// MaxTopKPromptLogprobs is the server's cap on topk_prompt_logprobs (§3.6: "server caps k at
	// 20"). It is a protocol fact, not a tunable limit.
	MaxTopKPromptLogprobs = 20
	// maxModelLen bounds model names and model paths in bytes.
	maxModelLen = 1024
)

// Limits bounds what a job may ask for. The zero value means "all defaults"; every field that is
// zero or negative takes its Default* value.
type Limits struct {
	// MaxCustomIDLen is the longest custom_id, in bytes (default 256).
	MaxCustomIDLen int
	// MaxLineBytes is the longest input line, in bytes without the line end (default 8 MiB).
	// Longer lines are skipped, kept in memory no further than this.
	MaxLineBytes int
	// MaxMaxTokens is the largest max_tokens a job may ask for (default 32768).
	MaxMaxTokens int
	// MaxMetadataBytes is the largest raw metadata value, in bytes (default 64 KiB).
	MaxMetadataBytes int
	// MaxNumSamples is the largest num_samples (OpenAI n) a job may ask for (default 16).
	MaxNumSamples int
	// MaxPromptChars bounds the prompt text in Unicode code points; for messages, the sum of the
	// contents (default 1,000,000).
	MaxPromptChars int
	// MaxPromptTokens bounds the length of prompt_tokens (default 131072).
	MaxPromptTokens int
}

// DefaultLimits returns the limits used for zero fields.
func DefaultLimits() Limits {
	return Limits{
		MaxCustomIDLen:   DefaultMaxCustomIDLen,
		MaxLineBytes:     DefaultMaxLineBytes,
		MaxMaxTokens:     DefaultMaxMaxTokens,
		MaxMetadataBytes: DefaultMaxMetadataBytes,
		MaxNumSamples:    DefaultMaxNumSamples,
		MaxPromptChars:   DefaultMaxPromptChars,
		MaxPromptTokens:  DefaultMaxPromptTokens,
	}
}

// withDefaults returns l with every zero or negative field replaced by its default.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&l.MaxCustomIDLen, d.MaxCustomIDLen)
	set(&l.MaxLineBytes, d.MaxLineBytes)
	set(&l.MaxMaxTokens, d.MaxMaxTokens)
	set(&l.MaxMetadataBytes, d.MaxMetadataBytes)
	set(&l.MaxNumSamples, d.MaxNumSamples)
	set(&l.MaxPromptChars, d.MaxPromptChars)
	set(&l.MaxPromptTokens, d.MaxPromptTokens)
	return l
}

package tinker

import (
	"errors"
	"fmt"
)

// ChunkType discriminates the chunks of a [ModelInput] (§T1).
type ChunkType string

// The chunk types the client can send. (dmel audio chunks are not supported.)
const (
	ChunkEncodedText       ChunkType = "encoded_text"
	ChunkImage             ChunkType = "image"
	ChunkImageAssetPointer ChunkType = "image_asset_pointer"
)

// Chunk is one piece of a prompt (§T1). Which fields are used depends on Type.
type Chunk struct {
	Type           ChunkType
	Tokens         []int  // encoded_text
	Data           []byte // image: raw bytes, sent as standard base64
	Format         string // image, image_asset_pointer: "png" or "jpeg"
	Location       string // image_asset_pointer: path or URL
	ExpectedTokens *int   // image, image_asset_pointer: advisory token count, omitted when nil
}

// ModelInput is a prompt: a list of chunks (§T1).
type ModelInput struct {
	Chunks []Chunk
}

// EncodedText returns a prompt made of a single encoded_text chunk.
func EncodedText(tokens []int) ModelInput {
	return ModelInput{Chunks: []Chunk{{Type: ChunkEncodedText, Tokens: tokens}}}
}

// EstimatedBytes is the dispatch estimate of §5.2: 10 bytes per token, the raw
// length of image data, the length of an asset pointer's location.
func (m ModelInput) EstimatedBytes() int64 {
	var n int64
	for i := range m.Chunks {
		c := &m.Chunks[i]
		switch c.Type {
		case ChunkEncodedText:
			n += 10 * int64(len(c.Tokens))
		case ChunkImage:
			n += int64(len(c.Data))
		case ChunkImageAssetPointer:
			n += int64(len(c.Location))
		}
	}
	return n
}

// Length returns the prompt length in tokens (§T1). Image chunks need
// ExpectedTokens; without it the length is unknown and an error is returned.
func (m ModelInput) Length() (int, error) {
	n := 0
	for i := range m.Chunks {
		c := &m.Chunks[i]
		switch c.Type {
		case ChunkEncodedText:
			n += len(c.Tokens)
		case ChunkImage, ChunkImageAssetPointer:
			if c.ExpectedTokens == nil {
				return 0, fmt.Errorf("tinker: chunk %d (%s) has no expected_tokens: length unknown", i, c.Type)
			}
			n += *c.ExpectedTokens
		default:
			return 0, fmt.Errorf("tinker: chunk %d: unknown type %q", i, c.Type)
		}
	}
	return n, nil
}

// Stop is the stop condition of [SamplingParams]: stop strings or stop token ids,
// not both (§T2). The zero value means none (the field is omitted).
type Stop struct {
	Strings []string
	Tokens  []int
}

// SamplingParams are the sampling parameters (§T2). Nil pointers are omitted
// from the request except Temperature, TopK and TopP, whose defaults (1.0, -1,
// 1.0) are always sent, as the SDK does.
type SamplingParams struct {
	MaxTokens   *int
	Seed        *int64
	Stop        Stop
	Temperature *float64
	TopK        *int
	TopP        *float64
}

// SampleRequest is one sample call (§3.6).
type SampleRequest struct {
	Prompt             ModelInput
	NumSamples         int // 0 means 1
	Params             SamplingParams
	PromptLogprobs     bool
	TopKPromptLogprobs int // 0 = none; servers cap k at 20
}

func (r *SampleRequest) validate() error {
	if r.NumSamples < 0 {
		return errors.New("tinker: NumSamples must not be negative")
	}
	if r.TopKPromptLogprobs < 0 {
		return errors.New("tinker: TopKPromptLogprobs must not be negative")
	}
	if len(r.Params.Stop.Strings) > 0 && len(r.Params.Stop.Tokens) > 0 {
		return errors.New("tinker: stop strings and stop tokens cannot be mixed")
	}
	if len(r.Prompt.Chunks) == 0 {
		return errors.New("tinker: empty prompt")
	}
	return nil
}

// StopReason says why a sequence ended.
type StopReason string

// The stop reasons of §T3/§T4.
const (
	StopReasonStop   StopReason = "stop"
	StopReasonLength StopReason = "length"
)

// SampledSequence is one completion.
type SampledSequence struct {
	StopReason StopReason
	Tokens     []int
	Logprobs   []float64 // nil when the server sent none; else len(Tokens) entries
}

// TokenLogprob is one cell of the top-k prompt logprobs.
type TokenLogprob struct {
	Token   int
	Logprob float64
}

// SampleResponse is the result of a sample (§T3/§T4).
type SampleResponse struct {
	Sequences []SampledSequence
	// PromptLogprobs is nil unless requested; one entry per prompt token, NaN
	// where not computed (always the first position).
	PromptLogprobs []float64
	// TopKPromptLogprobs is nil unless k > 0; per prompt position nil (not
	// computed) or up to k (token, logprob) pairs, sentinel cells trimmed.
	TopKPromptLogprobs [][]TokenLogprob
	// PromptCacheHitTokens counts prompt tokens billed as prefix-cache hits.
	PromptCacheHitTokens int
}

// SampleResult is what [Sampler.Sample] returns.
type SampleResult struct {
	Response    *SampleResponse
	Attempts    int    // §6.3 attempts, each with its own seq_id (1 when nothing was retried)
	Submissions int    // asample HTTP requests sent, including 429 and §6.2 retries
	SeqID       int64  // seq_id of the successful attempt
	RequestID   string // future id of the successful attempt
}

// SamplerSpec selects what a sampling session samples from (§3.5): a base model
// name, a tinker:// checkpoint path, or both.
type SamplerSpec struct {
	BaseModel string
	ModelPath string
}

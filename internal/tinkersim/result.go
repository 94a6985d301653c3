package tinkersim

import (
	"encoding/binary"
	"math"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// StopReason is why a sampled sequence ended (§T3, §T4 enum StopReason).
type StopReason int32

const (
	// StopReasonStop means a stop token id or stop string ended the sequence (wire "stop", proto 0).
	StopReasonStop StopReason = 0
	// StopReasonLength means max_tokens was reached (wire "length", proto 1).
	StopReasonLength StopReason = 1
)

// String returns the JSON spelling of the stop reason (§T3).
func (r StopReason) String() string {
	if r == StopReasonLength {
		return "length"
	}
	return "stop"
}

// Sequence is one sampled completion (§T4 SampledSequence).
type Sequence struct {
	// StopReason says why the sequence ended.
	StopReason StopReason
	// Tokens are the generated token ids; a stop token id that ended the sequence is included.
	Tokens []int32
	// Logprobs has one log probability per token, or is nil when not computed.
	Logprobs []float32
}

// TopKPromptLogprobs is the dense N×K top-k table of §T4, row-major (position i, rank j at i*K+j);
// empty cells hold token id 0 and logprob -99999.
type TopKPromptLogprobs struct {
	// K is the number of columns.
	K uint32
	// PromptLength is the number of rows (N).
	PromptLength uint32
	// TokenIDs holds N*K token ids.
	TokenIDs []int32
	// Logprobs holds N*K log probabilities.
	Logprobs []float32
}

// topkEmptyLogprob is the sentinel logprob of an empty top-k cell (§T4 decoding rules).
const topkEmptyLogprob = -99999.0

// SampleResponse is the result of one asample future (§T3, §T4).
type SampleResponse struct {
	// Sequences holds num_samples completions.
	Sequences []Sequence
	// PromptLogprobs is nil unless requested; position 0 is NaN (not computed).
	PromptLogprobs []float32
	// TopK is nil unless topk_prompt_logprobs > 0 was requested.
	TopK *TopKPromptLogprobs
	// PromptCacheHitTokens counts prompt tokens billed as prefix-cache hits.
	PromptCacheHitTokens int32
}

// AppendProto appends the protobuf encoding of r as tinker_public.SampleResponse (§T4):
// proto3 rules, so the default stop reason (STOP) and a zero prompt_cache_hit_tokens are not
// written, while the optional fields are written whenever they are set.
func (r *SampleResponse) AppendProto(b []byte) []byte {
	for i := range r.Sequences {
		s := &r.Sequences[i]
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sequenceSize(s)))
		if s.StopReason != StopReasonStop {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(int64(s.StopReason)))
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = appendInt32s(b, s.Tokens)
		if s.Logprobs != nil {
			b = protowire.AppendTag(b, 3, protowire.BytesType)
			b = appendFloat32s(b, s.Logprobs)
		}
	}
	if r.PromptLogprobs != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = appendFloat32s(b, r.PromptLogprobs)
	}
	if t := r.TopK; t != nil {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(topkSize(t)))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = appendInt32s(b, t.TokenIDs)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = appendFloat32s(b, t.Logprobs)
		if t.K != 0 {
			b = protowire.AppendTag(b, 3, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(t.K))
		}
		if t.PromptLength != 0 {
			b = protowire.AppendTag(b, 4, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(t.PromptLength))
		}
	}
	if r.PromptCacheHitTokens != 0 {
		b = protowire.AppendTag(b, 4, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(r.PromptCacheHitTokens)))
	}
	return b
}

func sequenceSize(s *Sequence) int {
	n := 0
	if s.StopReason != StopReasonStop {
		n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(int64(s.StopReason)))
	}
	n += protowire.SizeTag(2) + protowire.SizeBytes(4*len(s.Tokens))
	if s.Logprobs != nil {
		n += protowire.SizeTag(3) + protowire.SizeBytes(4*len(s.Logprobs))
	}
	return n
}

func topkSize(t *TopKPromptLogprobs) int {
	n := protowire.SizeTag(1) + protowire.SizeBytes(4*len(t.TokenIDs))
	n += protowire.SizeTag(2) + protowire.SizeBytes(4*len(t.Logprobs))
	if t.K != 0 {
		n += protowire.SizeTag(3) + protowire.SizeVarint(uint64(t.K))
	}
	if t.PromptLength != 0 {
		n += protowire.SizeTag(4) + protowire.SizeVarint(uint64(t.PromptLength))
	}
	return n
}

// appendInt32s writes a length-delimited little-endian int32 array (§T4 "bytes tokens").
func appendInt32s(b []byte, v []int32) []byte {
	b = protowire.AppendVarint(b, uint64(4*len(v)))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return b
}

// appendFloat32s writes a length-delimited little-endian float32 array (§T4).
func appendFloat32s(b []byte, v []float32) []byte {
	b = protowire.AppendVarint(b, uint64(4*len(v)))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// AppendJSON appends the JSON shape of §T3: "type":"sample", NaN prompt logprobs as null, the
// top-k table as per-position lists of [token_id, logprob] pairs with empty rows as null.
func (r *SampleResponse) AppendJSON(b []byte) []byte {
	b = append(b, `{"type":"sample","sequences":[`...)
	for i := range r.Sequences {
		s := &r.Sequences[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"stop_reason":"`...)
		b = append(b, s.StopReason.String()...)
		b = append(b, `","tokens":[`...)
		for j, t := range s.Tokens {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(t), 10)
		}
		b = append(b, `],"logprobs":`...)
		b = appendJSONFloats(b, s.Logprobs)
		b = append(b, '}')
	}
	b = append(b, `],"prompt_logprobs":`...)
	b = appendJSONFloats(b, r.PromptLogprobs)
	b = append(b, `,"topk_prompt_logprobs":`...)
	if t := r.TopK; t == nil || t.K == 0 || t.PromptLength == 0 {
		b = append(b, "null"...)
	} else {
		k := int(t.K)
		b = append(b, '[')
		for i := 0; i < int(t.PromptLength); i++ {
			if i > 0 {
				b = append(b, ',')
			}
			row := i * k
			if t.Logprobs[row] == topkEmptyLogprob && t.TokenIDs[row] == 0 {
				b = append(b, "null"...)
				continue
			}
			b = append(b, '[')
			for j := 0; j < k; j++ {
				if t.Logprobs[row+j] == topkEmptyLogprob && t.TokenIDs[row+j] == 0 {
					break // trailing empty cells are trimmed (§T4)
				}
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, '[')
				b = strconv.AppendInt(b, int64(t.TokenIDs[row+j]), 10)
				b = append(b, ',')
				b = appendJSONFloat(b, t.Logprobs[row+j])
				b = append(b, ']')
			}
			b = append(b, ']')
		}
		b = append(b, ']')
	}
	b = append(b, `,"prompt_cache_hit_tokens":`...)
	b = strconv.AppendInt(b, int64(r.PromptCacheHitTokens), 10)
	return append(b, '}')
}

func appendJSONFloats(b []byte, v []float32) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONFloat(b, x)
	}
	return append(b, ']')
}

// appendJSONFloat writes a float32 as the shortest decimal that round-trips, NaN/Inf as null.
func appendJSONFloat(b []byte, x float32) []byte {
	f := float64(x)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 32)
}

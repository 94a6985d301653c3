package tinker

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of tinker_public.SampleResponse and friends (§T4,
// schemas/tinker_public.proto).
const (
	fieldRespSequences      protowire.Number = 1
	fieldRespPromptLogprobs protowire.Number = 2
	fieldRespTopK           protowire.Number = 3
	fieldRespCacheHits      protowire.Number = 4

	fieldSeqStopReason protowire.Number = 1
	fieldSeqTokens     protowire.Number = 2
	fieldSeqLogprobs   protowire.Number = 3

	fieldTopKTokenIDs     protowire.Number = 1
	fieldTopKLogprobs     protowire.Number = 2
	fieldTopKK            protowire.Number = 3
	fieldTopKPromptLength protowire.Number = 4
)

// topKSentinel is the logprob of an empty top-k cell (§T4).
const topKSentinel = -99999.0

// decodeSampleResponseProto decodes a serialized tinker_public.SampleResponse
// following the rules of §T4: empty or absent logprobs mean none, an unknown
// stop_reason is an error, top-k only when set with k > 0 and prompt_length > 0.
func decodeSampleResponseProto(b []byte) (*SampleResponse, error) {
	r := &SampleResponse{}
	var topk []byte
	hasTopK := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("SampleResponse tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == fieldRespSequences && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("SampleResponse.sequences: %w", protowire.ParseError(n))
			}
			b = b[n:]
			seq, err := decodeSequence(v)
			if err != nil {
				return nil, fmt.Errorf("SampleResponse.sequences[%d]: %w", len(r.Sequences), err)
			}
			r.Sequences = append(r.Sequences, seq)
		case num == fieldRespPromptLogprobs && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("SampleResponse.prompt_logprobs: %w", protowire.ParseError(n))
			}
			b = b[n:]
			pl, err := float32s(v)
			if err != nil {
				return nil, fmt.Errorf("SampleResponse.prompt_logprobs: %w", err)
			}
			r.PromptLogprobs = pl
		case num == fieldRespTopK && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("SampleResponse.topk_prompt_logprobs: %w", protowire.ParseError(n))
			}
			b = b[n:]
			topk, hasTopK = v, true
		case num == fieldRespCacheHits && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, fmt.Errorf("SampleResponse.prompt_cache_hit_tokens: %w", protowire.ParseError(n))
			}
			b = b[n:]
			r.PromptCacheHitTokens = int(int32(v))
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, fmt.Errorf("SampleResponse field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	if hasTopK {
		rows, err := decodeTopK(topk)
		if err != nil {
			return nil, fmt.Errorf("SampleResponse.topk_prompt_logprobs: %w", err)
		}
		r.TopKPromptLogprobs = rows
	}
	return r, nil
}

func decodeSequence(b []byte) (SampledSequence, error) {
	s := SampledSequence{StopReason: StopReasonStop}
	var lp []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return s, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == fieldSeqStopReason && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return s, protowire.ParseError(n)
			}
			b = b[n:]
			switch v {
			case 0:
				s.StopReason = StopReasonStop
			case 1:
				s.StopReason = StopReasonLength
			default:
				return s, fmt.Errorf("unknown stop_reason %d", v)
			}
		case num == fieldSeqTokens && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return s, protowire.ParseError(n)
			}
			b = b[n:]
			t, err := int32s(v)
			if err != nil {
				return s, fmt.Errorf("tokens: %w", err)
			}
			s.Tokens = t
		case num == fieldSeqLogprobs && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return s, protowire.ParseError(n)
			}
			b = b[n:]
			lp = v
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return s, protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	if len(lp) > 0 {
		f, err := float32s(lp)
		if err != nil {
			return s, fmt.Errorf("logprobs: %w", err)
		}
		if len(f) != len(s.Tokens) {
			return s, fmt.Errorf("%d logprobs for %d tokens", len(f), len(s.Tokens))
		}
		s.Logprobs = f
	}
	return s, nil
}

func decodeTopK(b []byte) ([][]TokenLogprob, error) {
	var ids, lps []byte
	var k, n uint64
	for len(b) > 0 {
		num, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		b = b[m:]
		switch {
		case (num == fieldTopKTokenIDs || num == fieldTopKLogprobs) && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			b = b[m:]
			if num == fieldTopKTokenIDs {
				ids = v
			} else {
				lps = v
			}
		case (num == fieldTopKK || num == fieldTopKPromptLength) && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			b = b[m:]
			if num == fieldTopKK {
				k = uint64(uint32(v))
			} else {
				n = uint64(uint32(v))
			}
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			b = b[m:]
		}
	}
	if k == 0 || n == 0 {
		return nil, nil // present but empty: treated as not requested (§T4)
	}
	cells := n * k // both below 2^32: no overflow, but 4*cells may, so the lengths are divided
	if len(ids)%4 != 0 || uint64(len(ids)/4) != cells || len(lps) != len(ids) {
		return nil, fmt.Errorf("dense %dx%d matrix needs %d cells, got %d ids and %d logprobs", n, k, cells, len(ids)/4, len(lps)/4)
	}
	rows := make([][]TokenLogprob, n)
	flat := make([]TokenLogprob, 0, cells)
	for i := uint64(0); i < n; i++ {
		start := len(flat)
		for j := uint64(0); j < k; j++ {
			c := 4 * (i*k + j)
			flat = append(flat, TokenLogprob{
				Token:   int(int32(binary.LittleEndian.Uint32(ids[c:]))),
				Logprob: float64(math.Float32frombits(binary.LittleEndian.Uint32(lps[c:]))),
			})
		}
		row := flat[start:len(flat):len(flat)]
		// List view of §T4: a row whose first cell is the sentinel is null,
		// otherwise trailing sentinel cells are trimmed.
		if isSentinel(row[0]) {
			continue
		}
		for len(row) > 0 && isSentinel(row[len(row)-1]) {
			row = row[:len(row)-1]
		}
		rows[i] = row
	}
	return rows, nil
}

func isSentinel(c TokenLogprob) bool { return c.Token == 0 && c.Logprob == topKSentinel }

// int32s decodes little-endian int32s; empty input gives nil.
func int32s(b []byte) ([]int, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%d bytes is not a multiple of 4", len(b))
	}
	if len(b) == 0 {
		return nil, nil
	}
	out := make([]int, len(b)/4)
	for i := range out {
		out[i] = int(int32(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return out, nil
}

// float32s decodes little-endian float32s; empty input gives nil ("none").
func float32s(b []byte) ([]float64, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%d bytes is not a multiple of 4", len(b))
	}
	if len(b) == 0 {
		return nil, nil
	}
	out := make([]float64, len(b)/4)
	for i := range out {
		out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return out, nil
}

// jsonSampleResponse is the JSON shape of §T3.
type jsonSampleResponse struct {
	Type      string `json:"type"`
	Sequences []struct {
		StopReason string    `json:"stop_reason"`
		Tokens     []int     `json:"tokens"`
		Logprobs   []float64 `json:"logprobs"`
	} `json:"sequences"`
	PromptLogprobs       []*float64    `json:"prompt_logprobs"`
	TopKPromptLogprobs   [][][]float64 `json:"topk_prompt_logprobs"`
	PromptCacheHitTokens int           `json:"prompt_cache_hit_tokens"`
}

// decodeSampleResponseJSON decodes the §T3 JSON shape (accepted as a superset of
// SDK 0.25.0, which only takes protobuf; §11.5).
func decodeSampleResponseJSON(b []byte) (*SampleResponse, error) {
	var w jsonSampleResponse
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, err
	}
	if w.Type != "" && w.Type != "sample" {
		return nil, fmt.Errorf("unexpected type %.64q", w.Type) // the service's text, cut
	}
	if w.Sequences == nil {
		return nil, errors.New("no sequences")
	}
	r := &SampleResponse{PromptCacheHitTokens: w.PromptCacheHitTokens}
	r.Sequences = make([]SampledSequence, len(w.Sequences))
	for i, s := range w.Sequences {
		switch StopReason(s.StopReason) {
		case StopReasonStop, StopReasonLength:
		default:
			return nil, fmt.Errorf("sequences[%d]: unknown stop_reason %.64q", i, s.StopReason) // the service's text, cut
		}
		if s.Logprobs != nil && len(s.Logprobs) != len(s.Tokens) {
			return nil, fmt.Errorf("sequences[%d]: %d logprobs for %d tokens", i, len(s.Logprobs), len(s.Tokens))
		}
		r.Sequences[i] = SampledSequence{StopReason: StopReason(s.StopReason), Tokens: s.Tokens, Logprobs: s.Logprobs}
	}
	if w.PromptLogprobs != nil {
		r.PromptLogprobs = make([]float64, len(w.PromptLogprobs))
		for i, p := range w.PromptLogprobs {
			if p == nil {
				r.PromptLogprobs[i] = math.NaN()
			} else {
				r.PromptLogprobs[i] = *p
			}
		}
	}
	if w.TopKPromptLogprobs != nil {
		r.TopKPromptLogprobs = make([][]TokenLogprob, len(w.TopKPromptLogprobs))
		for i, row := range w.TopKPromptLogprobs {
			if row == nil {
				continue
			}
			cells := make([]TokenLogprob, len(row))
			for j, pair := range row {
				if len(pair) != 2 {
					return nil, fmt.Errorf("topk_prompt_logprobs[%d][%d]: want [token, logprob]", i, j)
				}
				cells[j] = TokenLogprob{Token: int(pair[0]), Logprob: pair[1]}
			}
			r.TopKPromptLogprobs[i] = cells
		}
	}
	return r, nil
}

package tinker

import (
	"encoding/base64"
	"errors"
	"math"
	"strconv"
	"unicode/utf8"
)

// appendSampleRequest appends the asample body of §3.6 in the SDK's field order:
// null fields omitted, defaults (type, prompt_logprobs, topk_prompt_logprobs and
// the §T2 sampling defaults) always present.
func appendSampleRequest(b []byte, r *SampleRequest, samplerID string, seq int64) ([]byte, error) {
	n := r.NumSamples
	if n == 0 {
		n = 1
	}
	b = append(b, `{"num_samples":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"prompt":`...)
	var err error
	if b, err = appendModelInput(b, &r.Prompt); err != nil {
		return nil, err
	}
	b = append(b, `,"sampling_params":`...)
	if b, err = appendSamplingParams(b, &r.Params); err != nil {
		return nil, err
	}
	b = append(b, `,"sampling_session_id":`...)
	b = appendString(b, samplerID)
	b = append(b, `,"seq_id":`...)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, `,"prompt_logprobs":`...)
	b = strconv.AppendBool(b, r.PromptLogprobs)
	b = append(b, `,"topk_prompt_logprobs":`...)
	b = strconv.AppendInt(b, int64(r.TopKPromptLogprobs), 10)
	b = append(b, `,"type":"sample"}`...)
	return b, nil
}

func appendModelInput(b []byte, m *ModelInput) ([]byte, error) {
	b = append(b, `{"chunks":[`...)
	for i := range m.Chunks {
		if i > 0 {
			b = append(b, ',')
		}
		c := &m.Chunks[i]
		switch c.Type {
		case ChunkEncodedText:
			b = append(b, `{"tokens":`...)
			b = appendInts(b, c.Tokens)
		case ChunkImage:
			b = append(b, `{"data":"`...)
			b = base64.StdEncoding.AppendEncode(b, c.Data)
			b = append(b, `","format":`...)
			b = appendString(b, c.Format)
			b = appendOptInt(b, `,"expected_tokens":`, c.ExpectedTokens)
		case ChunkImageAssetPointer:
			b = append(b, `{"format":`...)
			b = appendString(b, c.Format)
			b = append(b, `,"location":`...)
			b = appendString(b, c.Location)
			b = appendOptInt(b, `,"expected_tokens":`, c.ExpectedTokens)
		default:
			return nil, errors.New("tinker: unknown chunk type " + strconv.Quote(string(c.Type)))
		}
		b = append(b, `,"type":`...)
		b = appendString(b, string(c.Type))
		b = append(b, '}')
	}
	return append(b, "]}"...), nil
}

func appendSamplingParams(b []byte, p *SamplingParams) ([]byte, error) {
	b = append(b, '{')
	if p.MaxTokens != nil {
		b = append(b, `"max_tokens":`...)
		b = strconv.AppendInt(b, int64(*p.MaxTokens), 10)
		b = append(b, ',')
	}
	if p.Seed != nil {
		b = append(b, `"seed":`...)
		b = strconv.AppendInt(b, *p.Seed, 10)
		b = append(b, ',')
	}
	switch {
	case len(p.Stop.Strings) > 0:
		b = append(b, `"stop":[`...)
		for i, s := range p.Stop.Strings {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, s)
		}
		b = append(b, "],"...)
	case len(p.Stop.Tokens) > 0:
		b = append(b, `"stop":`...)
		b = appendInts(b, p.Stop.Tokens)
		b = append(b, ',')
	}
	temp, topK, topP := 1.0, -1, 1.0
	if p.Temperature != nil {
		temp = *p.Temperature
	}
	if p.TopK != nil {
		topK = *p.TopK
	}
	if p.TopP != nil {
		topP = *p.TopP
	}
	var err error
	b = append(b, `"temperature":`...)
	if b, err = appendFloat(b, temp); err != nil {
		return nil, err
	}
	b = append(b, `,"top_k":`...)
	b = strconv.AppendInt(b, int64(topK), 10)
	b = append(b, `,"top_p":`...)
	if b, err = appendFloat(b, topP); err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

func appendInts(b []byte, v []int) []byte {
	b = append(b, '[')
	for i, t := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(t), 10)
	}
	return append(b, ']')
}

func appendOptInt(b []byte, key string, v *int) []byte {
	if v == nil {
		return b
	}
	b = append(b, key...)
	return strconv.AppendInt(b, int64(*v), 10)
}

// appendFloat writes a float the way Python's json module does for finite
// values: shortest round-trip form, with ".0" on integral values (1.0, not 1).
func appendFloat(b []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, errors.New("tinker: sampling parameter is not a finite number")
	}
	start := len(b)
	if a := math.Abs(f); a != 0 && (a < 1e-4 || a >= 1e16) {
		b = strconv.AppendFloat(b, f, 'e', -1, 64)
	} else {
		b = strconv.AppendFloat(b, f, 'f', -1, 64)
	}
	for _, c := range b[start:] {
		if c == '.' || c == 'e' {
			return b, nil
		}
	}
	return append(b, ".0"...), nil
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

package jobs

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"
)

// AppendJSON appends the compact one-line JSON of the result to b, exactly as Encode writes it.
// The worker encodes one result per sample, so this is written out by hand rather than through
// reflection (bench comparison 2); TestAppendJSONMatchesEncodingJSON and FuzzResultJSON hold it
// to encoding/json's output, byte for byte.
func (r *Result) AppendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"custom_id":`...)
	b = appendJSONString(b, r.CustomID)
	b = append(b, `,"batch_id":`...)
	b = appendJSONString(b, r.BatchID)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, string(r.Status))
	if r.Model != "" {
		b = append(b, `,"model":`...)
		b = appendJSONString(b, r.Model)
	}
	if r.Format != "" {
		b = append(b, `,"format":`...)
		b = appendJSONString(b, r.Format)
	}
	if r.OpenAILogprobs {
		b = append(b, `,"openai_logprobs":true`...)
	}
	if len(r.Samples) > 0 {
		b = append(b, `,"samples":[`...)
		for i := range r.Samples {
			if i > 0 {
				b = append(b, ',')
			}
			b = r.Samples[i].appendJSON(b)
		}
		b = append(b, ']')
	}
	if len(r.PromptLogprobs) > 0 {
		b = append(b, `,"prompt_logprobs":`...)
		b = r.PromptLogprobs.appendJSON(b)
	}
	if len(r.TopKPromptLogprobs) > 0 {
		b = append(b, `,"topk_prompt_logprobs":[`...)
		for i, row := range r.TopKPromptLogprobs {
			if i > 0 {
				b = append(b, ',')
			}
			if row == nil {
				b = append(b, "null"...)
				continue
			}
			b = append(b, '[')
			for k, c := range row {
				if k > 0 {
					b = append(b, ',')
				}
				b = append(b, '[')
				b = strconv.AppendInt(b, int64(c.Token), 10)
				b = append(b, ',')
				b = appendLogprob(b, c.Logprob)
				b = append(b, ']')
			}
			b = append(b, ']')
		}
		b = append(b, ']')
	}
	if u := r.Usage; u != nil {
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
		b = append(b, `,"cache_hit_tokens":`...)
		b = strconv.AppendInt(b, int64(u.CacheHitTokens), 10)
		b = append(b, '}')
	}
	if e := r.Error; e != nil {
		b = append(b, `,"error":{"code":`...)
		b = appendJSONString(b, e.Code)
		b = append(b, `,"message":`...)
		b = appendJSONString(b, e.Message)
		b = append(b, `,"category":`...)
		b = appendJSONString(b, string(e.Category))
		b = append(b, `,"retryable":`...)
		b = strconv.AppendBool(b, e.Retryable)
		b = append(b, '}')
	}
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(r.Attempts), 10)
	b = append(b, `,"latency_ms":`...)
	b = strconv.AppendInt(b, r.LatencyMS, 10)
	if r.Metadata != nil {
		var err error
		if b, err = appendMetadata(b, r.Metadata); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func (s *Sample) appendJSON(b []byte) []byte {
	b = append(b, `{"text":`...)
	b = appendJSONString(b, s.Text)
	b = append(b, `,"tokens":`...)
	if s.Tokens == nil {
		b = append(b, "null"...)
	} else {
		b = appendInts(b, s.Tokens)
	}
	if len(s.Logprobs) > 0 {
		b = append(b, `,"logprobs":`...)
		b = s.Logprobs.appendJSON(b)
	}
	if len(s.TokenBytes) > 0 {
		b = append(b, `,"token_bytes":`...)
		b = s.TokenBytes.appendJSON(b)
	}
	b = append(b, `,"stop_reason":`...)
	b = appendJSONString(b, s.StopReason)
	return append(b, '}')
}

// appendJSON writes the list with null for NaN (see MarshalJSON).
func (l Logprobs) appendJSON(b []byte) []byte {
	if l == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, f := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendLogprob(b, f)
	}
	return append(b, ']')
}

// errMetadataNotJSON is the error for metadata that is not one valid JSON value.
var errMetadataNotJSON = errors.New("metadata is not valid JSON")

// appendMetadata appends `,"metadata":` and raw, byte for byte unless it holds a newline (then
// compacted), as results and jobs were encoded through encoding/json.
func appendMetadata(b []byte, raw json.RawMessage) ([]byte, error) {
	if !json.Valid(raw) {
		return nil, errMetadataNotJSON
	}
	b = append(b, `,"metadata":`...)
	if bytes.IndexByte(raw, '\n') < 0 {
		return append(b, raw...), nil
	}
	c := bytes.NewBuffer(b)
	if err := json.Compact(c, raw); err != nil {
		return nil, errMetadataNotJSON
	}
	return c.Bytes(), nil
}

// appendJSONString appends s as a JSON string the way encoding/json writes it with HTML
// escaping off: '"', '\\' and control characters escaped (\b \f \n \r \t by name), invalid
// UTF-8 replaced by \ufffd, and U+2028 and U+2029 escaped (JSONP safety, as encoding/json).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; ; {
		if i = asciiPlainEnd(s, i); i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				const hex = "0123456789abcdef"
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', byte('0'+r-'\u2020'))
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

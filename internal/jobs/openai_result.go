package jobs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// OpenAICodeBatchCancelled is the error.code of an OpenAI Batch output line for a request that
// was never executed because its batch was cancelled (OpenAI documents "batch_expired" for the
// requests of an expired batch; "batch_cancelled" is its counterpart).
const OpenAICodeBatchCancelled = "batch_cancelled"

// OpenAI error types of the error bodies written by AppendOpenAI.
const (
	openAITypeInvalidRequest = "invalid_request_error"
	openAITypeRateLimit      = "requests" // OpenAI's 429 bodies say "requests" or "tokens"
	openAITypeServer         = "server_error"
)

// AppendOpenAI appends the result as one line of the OpenAI Batch API output format (compact
// JSON, no newline), so that output parsing written for OpenAI batches reads tinkerfleet results
// unchanged:
//
//	{"id":"batch_req_<h>","custom_id":…,"response":{"status_code":200,"request_id":"req_<h>","body":{…}},"error":null}
//
// <h> is the hex of the first 12 bytes of sha256(batch_id + "/" + custom_id): writing a result
// again gives the same ids. created (Unix seconds; the zero time writes 0) is the body's
// "created"; submit passes the time the result was stored, which makes the line reproducible too.
//
// The body of an ok result is a chat completion ("object":"chat.completion", id "chatcmpl-<h>",
// each choice's "message" {"role":"assistant","content":text,"refusal":null}) when Format is
// FormatOpenAIChat, and a completion ("object":"text_completion", id "cmpl-<h>", each choice's
// "text") otherwise, native jobs included: a result does not record whether a native job had
// messages. There is one choice per sample (n > 1 gives several), "finish_reason" is the sample's
// stop_reason ("stop" or "length"), and "usage" has prompt_tokens, completion_tokens,
// total_tokens and prompt_tokens_details.cached_tokens (the prefix-cache hits).
//
// A choice's "logprobs" is null unless the job asked for them (OpenAILogprobs: chat
// "logprobs": true, completions "logprobs": 0); then they have one entry per sampled token,
// the stop token that ended the sample and a chat's reasoning included, as vLLM answers:
//
//	chat:        {"content":[{"token":t,"logprob":lp,"bytes":[…],"top_logprobs":[]},…],"refusal":null}
//	completions: {"tokens":[t,…],"token_logprobs":[lp,…],"top_logprobs":[{t:lp},…],"text_offset":[n,…]}
//
// t is the token's bytes (Sample.TokenBytes) as text when they are UTF-8, and when the token is
// a part of a character OpenAI's "bytes:" with each byte outside a whole character as \xNN
// ("bytes:\xe4\xbd"), its "bytes" saying which; without bytes (the worker had no tokenizer for
// a prompt of token ids) t is vLLM's "token_id:<id>" and "bytes" null. lp is at least -9999.0,
// OpenAI's "very unlikely", which also stands for a logprob the service did not return (vLLM
// writes both so; openai-python's types have no null there). A completion's top_logprobs hold
// the sampled token alone, as vLLM answers "logprobs": 0 (OpenAI's API returns the sampled
// token's beside the alternatives asked for), and text_offset counts the characters (code
// points) of the tokens before each one from the start of the completion, as vLLM does
// without echo (bytes that are no UTF-8 count as the text's U+FFFD, one per maximal subpart).
//
// A chat sample that reasons first is read as vLLM's reasoning
// parsers read it: "content" is the answer ("" when the sample ended before it) and
// "reasoning_content" the reasoning. That is a sample in gpt-oss's harmony format (its text
// begins with "<|channel|>"): its final channel, and its other channels (analysis,
// commentary) joined by a blank line; and a thinking Qwen3's or DeepSeek V3.1's sample: the
// text after "</think>" (newlines before it trimmed), and the text before it, after a
// leading "<think>" (Qwen3 writes one; V3.1's prompt ends with it, and only a DeepSeek
// model's text is split at a "</think>" without one). The native result keeps the whole text. batch_id, attempts, latency_ms and metadata have no place in the
// OpenAI format and are left out.
//
// Failures map as follows; the error body is {"error":{"message":…,"type":…,"param":null,"code":…}}
// with tinkerfleet's error code (Code* constants) as "code" and its message as "message":
//
//	result                                   status_code  error type / line error
//	ok                                       200          (completion body)
//	error, code rate_limited                 429          "requests"
//	error, category user                     400          "invalid_request_error"
//	  (invalid_job, context_too_long, tokenize_failed, api_error, failed_future)
//	error, category server or unknown        500          "server_error"
//	  (dead_letter, timeout, internal)
//	cancelled                                —            "response":null, "error":{"code":"batch_cancelled","message":…}
//
// The category decides between 400 and 500 because it is what says whose fault a failure is
// (§7.2); the worker's one user-category internal error, a result too large to store, is a 400
// like the request's other faults. A cancelled request was never executed, so, as OpenAI writes
// the requests of an expired batch, it has no response and a line-level error instead.
//
// It returns an error, and appends nothing, when the result fails Validate.
func (r *Result) AppendOpenAI(b []byte, created time.Time) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("openai result %q: %w", r.CustomID, err)
	}
	return r.appendOpenAI(b, created, len(r.Samples), func(i int) *Sample { return &r.Samples[i] }), nil
}

// appendOpenAI is AppendOpenAI on a valid result whose n samples are sample(0) … sample(n-1)
// (r.Samples itself is not read), sample being called once for each i in turn:
// AppendOpenAIFromJSON decodes each one only when it is written, into the same Sample.
func (r *Result) appendOpenAI(b []byte, created time.Time, n int, sample func(i int) *Sample) []byte {
	h := openAIHash(r.BatchID, r.CustomID)
	b = append(b, `{"id":"batch_req_`...)
	b = append(b, h[:]...)
	b = append(b, `","custom_id":`...)
	b = appendJSONString(b, r.CustomID)
	if r.Status == StatusCancelled {
		b = append(b, `,"response":null,"error":{"code":"`+OpenAICodeBatchCancelled+`","message":`...)
		b = appendJSONString(b, r.Error.Message)
		return append(b, "}}"...)
	}
	status := 200
	if r.Status == StatusError {
		status = openAIStatus(r.Error)
	}
	b = append(b, `,"response":{"status_code":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"request_id":"req_`...)
	b = append(b, h[:]...)
	b = append(b, `","body":`...)
	if r.Status == StatusOK {
		b = r.appendOpenAICompletion(b, h, created, n, sample)
	} else {
		b = appendOpenAIError(b, status, r.Error)
	}
	return append(b, `},"error":null}`...)
}

// openAIStatus is the HTTP status of a failed request (see AppendOpenAI).
func openAIStatus(e *ResultError) int {
	switch {
	case e.Code == CodeRateLimited:
		return 429
	case e.Category == CategoryUser:
		return 400
	}
	return 500
}

// appendOpenAIError appends an OpenAI error body for status.
func appendOpenAIError(b []byte, status int, e *ResultError) []byte {
	typ := openAITypeServer
	switch status {
	case 400:
		typ = openAITypeInvalidRequest
	case 429:
		typ = openAITypeRateLimit
	}
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, e.Message)
	b = append(b, `,"type":"`...)
	b = append(b, typ...)
	b = append(b, `","param":null,"code":`...)
	b = appendJSONString(b, e.Code)
	return append(b, "}}"...)
}

// appendOpenAICompletion appends the chat.completion or text_completion body of an ok result
// whose n samples are sample(i).
func (r *Result) appendOpenAICompletion(b []byte, h [24]byte, created time.Time, n int, sample func(i int) *Sample) []byte {
	chat := r.Format == FormatOpenAIChat
	if chat {
		b = append(b, `{"id":"chatcmpl-`...)
	} else {
		b = append(b, `{"id":"cmpl-`...)
	}
	b = append(b, h[:]...)
	if chat {
		b = append(b, `","object":"chat.completion","created":`...)
	} else {
		b = append(b, `","object":"text_completion","created":`...)
	}
	var unix int64
	if !created.IsZero() {
		unix = created.Unix()
	}
	b = strconv.AppendInt(b, unix, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, r.Model)
	b = append(b, `,"choices":[`...)
	for i := range n {
		s := sample(i)
		if i > 0 {
			b = append(b, ',')
		}
		if chat {
			b = append(b, `{"index":`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `,"message":{"role":"assistant","content":`...)
			if final, reasoning, ok := reasoningApart(r.Model, s.Text); ok {
				b = appendJSONString(b, final)
				b = append(b, `,"reasoning_content":`...)
				b = appendJSONString(b, reasoning)
			} else {
				b = appendJSONString(b, s.Text)
			}
			b = append(b, `,"refusal":null},"logprobs":`...)
			if r.OpenAILogprobs {
				b = appendChatLogprobs(b, s)
			} else {
				b = append(b, "null"...)
			}
		} else {
			b = append(b, `{"text":`...)
			b = appendJSONString(b, s.Text)
			b = append(b, `,"index":`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `,"logprobs":`...)
			if r.OpenAILogprobs {
				b = appendCompletionLogprobs(b, s)
			} else {
				b = append(b, "null"...)
			}
		}
		b = append(b, `,"finish_reason":`...)
		b = appendJSONString(b, s.StopReason)
		b = append(b, '}')
	}
	var u Usage
	if r.Usage != nil {
		u = *r.Usage
	}
	b = append(b, `],"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens)+int64(u.CompletionTokens), 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CacheHitTokens), 10)
	return append(b, "}}}"...)
}

// openAIMinLogprob is the least logprob an OpenAI line holds: OpenAI's "very unlikely", which
// vLLM writes for -inf and lower values, and in a chat for a token without a logprob.
const openAIMinLogprob = -9999.0

// appendChatLogprobs appends the ChoiceLogprobs of sample s: {"content": [one
// ChatCompletionTokenLogprob per sampled token], "refusal": null}, each {"token", "logprob",
// "bytes", "top_logprobs": []} (see AppendOpenAI).
func appendChatLogprobs(b []byte, s *Sample) []byte {
	b = append(b, `{"content":[`...)
	for i, id := range s.Tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"token":`...)
		b = appendJSONString(b, openAIToken(s.TokenBytes, i, id))
		b = append(b, `,"logprob":`...)
		b = appendOpenAILogprob(b, openAILogprob(s.Logprobs, i))
		b = append(b, `,"bytes":`...)
		if s.TokenBytes != nil {
			b = appendByteList(b, s.TokenBytes[i])
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"top_logprobs":[]}`...)
	}
	return append(b, `],"refusal":null}`...)
}

// appendCompletionLogprobs appends the completion Logprobs of sample s: "tokens",
// "token_logprobs", "top_logprobs" (per token the sampled token alone, {token: logprob}, as
// vLLM answers "logprobs": 0) and "text_offset" (see AppendOpenAI).
func appendCompletionLogprobs(b []byte, s *Sample) []byte {
	tokens := make([]string, len(s.Tokens))
	for i, id := range s.Tokens {
		tokens[i] = openAIToken(s.TokenBytes, i, id)
	}
	b = append(b, `{"tokens":[`...)
	for i, t := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, t)
	}
	b = append(b, `],"token_logprobs":[`...)
	for i := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendOpenAILogprob(b, openAILogprob(s.Logprobs, i))
	}
	b = append(b, `],"top_logprobs":[`...)
	for i, t := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(append(b, '{'), t)
		b = appendOpenAILogprob(append(b, ':'), openAILogprob(s.Logprobs, i))
		b = append(b, '}')
	}
	b = append(b, `],"text_offset":[`...)
	// The offset of a token is the number of characters of the text that end before its first
	// byte: the text is the tokens' bytes with those that are no UTF-8 made U+FFFD, one per
	// maximal subpart (as the worker's Decode makes them), which a token that begins a
	// character cannot tell before the next tokens.
	var all []byte
	for _, tb := range s.TokenBytes {
		all = append(all, tb...)
	}
	offset, end, start := 0, 0, 0 // characters in all[:end]; start: the token's first byte
	for i := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		for end < len(all) {
			size := charSize(all[end:])
			if end+size > start {
				break // the character holding the token's first byte
			}
			offset++
			end += size
		}
		b = strconv.AppendInt(b, int64(offset), 10)
		if s.TokenBytes != nil { // else no text to count in: the worker had no tokenizer, and the text is ""
			start += len(s.TokenBytes[i])
		}
	}
	return append(b, "]}"...)
}

// charSize is the length of the first character of b, which is not empty, as text: a UTF-8
// sequence, or the maximal subpart of one that is invalid (a single U+FFFD in the text).
func charSize(b []byte) int {
	if r, size := utf8.DecodeRune(b); r != utf8.RuneError || size > 1 {
		return size
	}
	n := 1
	for n < len(b) && n < utf8.UTFMax && !utf8.FullRune(b[:n+1]) {
		n++ // still the beginning of a sequence
	}
	return n
}

// openAILogprob returns the logprob of token i, at least openAIMinLogprob (as vLLM writes
// them), and openAIMinLogprob when there is none (no logprobs, or NaN): openai-python's
// types have a number there, never null.
func openAILogprob(l Logprobs, i int) float64 {
	if i >= len(l) || math.IsNaN(l[i]) {
		return openAIMinLogprob
	}
	return max(l[i], openAIMinLogprob)
}

// appendOpenAILogprob appends lp, from openAILogprob, as the native format writes a logprob,
// and openAIMinLogprob as OpenAI writes it, "-9999.0".
func appendOpenAILogprob(b []byte, lp float64) []byte {
	if lp <= openAIMinLogprob {
		return append(b, "-9999.0"...)
	}
	return appendLogprob(b, lp)
}

// openAIToken is the "token" string of token i, id, of a sample whose tokens' bytes are tb:
// its bytes when they are UTF-8; OpenAI's "bytes:" and the bytes as \xNN when they are a part
// of a character (each byte outside a whole character escaped, as Python's
// decode("utf-8", "backslashreplace") writes it), so that "bytes" holds them; and vLLM's
// "token_id:<id>" when there are no bytes (the worker had no tokenizer).
func openAIToken(tb TokenBytes, i, id int) string {
	if tb == nil {
		return "token_id:" + strconv.Itoa(id)
	}
	t := tb[i]
	if utf8.Valid(t) {
		return string(t)
	}
	const hex = "0123456789abcdef"
	out := make([]byte, 0, len("bytes:")+4*len(t))
	out = append(out, "bytes:"...)
	for len(t) > 0 {
		r, size := utf8.DecodeRune(t)
		if r == utf8.RuneError && size <= 1 {
			out = append(out, '\\', 'x', hex[t[0]>>4], hex[t[0]&0xf])
			t = t[1:]
			continue
		}
		out = append(out, t[:size]...)
		t = t[size:]
	}
	return string(out)
}

// OpenAIRequestID is the id of the OpenAI Batch output line that AppendOpenAI writes for the
// job customID of batch ("batch_req_" and 24 hex digits): it tells which batch a line of an
// output file belongs to, which the line does not say otherwise.
func OpenAIRequestID(batch, customID string) string {
	h := openAIHash(batch, customID)
	return "batch_req_" + string(h[:])
}

// openAIHash is the hex of the first 12 bytes of sha256(batch + "/" + customID), the stable
// part of the ids AppendOpenAI writes.
func openAIHash(batch, customID string) [24]byte {
	sum := sha256.Sum256([]byte(batch + "/" + customID))
	var h [24]byte
	hex.Encode(h[:], sum[:12])
	return h
}

// reasoningApart splits a chat sample of model that reasons before it answers into its
// answer and its reasoning (see AppendOpenAI); ok is false for any other sample.
func reasoningApart(model, text string) (answer, reasoning string, ok bool) {
	if answer, reasoning, ok = harmonyChannels(text); ok {
		return answer, reasoning, true
	}
	const open, closing = "<think>", "</think>"
	thought, rest, closed := strings.Cut(text, closing)
	switch {
	case strings.HasPrefix(text, open) && !closed:
		return "", strings.Trim(text[len(open):], "\n"), true // it ended while thinking
	case strings.HasPrefix(text, open):
		thought = thought[len(open):]
	case !closed || !strings.Contains(strings.ToLower(model), "deepseek"):
		return "", "", false
	}
	return strings.TrimLeft(rest, "\n"), strings.Trim(thought, "\n"), true
}

// harmonyChannels splits a gpt-oss completion, written in the harmony format after the
// prompt's "<|start|>assistant", into the text of its final channel and that of its other
// channels, each joined by a blank line. Each message is "<|channel|>" + channel (and, for a
// tool call, a content type) + "<|message|>" + text, ended by "<|end|>" and followed by
// "<|start|>assistant" (perhaps with a recipient) and the next; the last one's stop token
// (<|return|> or <|call|>) is already cut. ok is false when text does not begin with
// "<|channel|>".
func harmonyChannels(text string) (final, other string, ok bool) {
	const channel, message, next = "<|channel|>", "<|message|>", "<|start|>assistant"
	if !strings.HasPrefix(text, channel) {
		return "", "", false
	}
	var finals, others []string
	for rest := text; strings.HasPrefix(rest, channel); {
		header, body, found := strings.Cut(rest[len(channel):], message)
		if !found {
			break // the sample ended inside a header
		}
		name, _, _ := strings.Cut(header, " ")
		body, rest, _ = strings.Cut(body, "<|end|>")
		body, _, _ = strings.Cut(body, "<|call|>")
		body, _, _ = strings.Cut(body, "<|return|>")
		if name == "final" {
			finals = append(finals, body)
		} else {
			others = append(others, body)
		}
		rest = strings.TrimPrefix(rest, next)
		if i := strings.Index(rest, channel); i > 0 && !strings.Contains(rest[:i], message) {
			rest = rest[i:] // a recipient before the channel: " to=functions.f"
		}
	}
	return strings.Join(finals, "\n\n"), strings.Join(others, "\n\n"), true
}

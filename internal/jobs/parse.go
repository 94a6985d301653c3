package jobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// checkSyntax rejects lines that are not UTF-8 or not a single valid JSON object.
func checkSyntax(b []byte) *FieldError {
	if !utf8.Valid(b) {
		off := 0
		for off < len(b) {
			r, size := utf8.DecodeRune(b[off:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			off += size
		}
		return fieldErr("", fmt.Sprintf("invalid UTF-8 at byte %d (lines must be UTF-8 JSON)", off+1))
	}
	if !validJSON(b) {
		var raw json.RawMessage
		err := json.Unmarshal(b, &raw)
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fieldErr("", fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, se.Error()))
		}
		return fieldErr("", "malformed JSON")
	}
	if !isObject(b) {
		return fieldErr("", "a line must be a JSON object, not "+jsonType(b))
	}
	return nil
}

// parseLine turns one syntactically unchecked, trimmed, non-blank line into a Job, detecting its
// format: a line with any of body, url or method is an OpenAI Batch API line, any other line is a
// native tinkerfleet line. It also returns the field names to validate the job with.
func parseLine(b []byte) (Job, fieldNames, *FieldError) {
	if fe := checkSyntax(b); fe != nil {
		return Job{}, fieldNames{}, fe
	}
	var m nativeMembers
	openai, fe := m.read(b, false)
	switch {
	case openai:
		return parseOpenAI(b)
	case fe != nil:
		return Job{}, nativeNames(), fe
	}
	j, fe := m.job()
	return j, nativeNames(), fe
}

// present reports whether a raw member value was given and is not null. Null is treated like an
// absent field everywhere except metadata (which is returned as given).
func present(v []byte) bool { return v != nil && !isNull(v) }

// typeErr says what a value should have been.
func typeErr(path, want string, v []byte) *FieldError {
	return fieldErr(path, "must be "+want+", not "+jsonType(v))
}

// getString decodes a present value that must be a string.
func getString(v []byte, path string) (string, *FieldError) {
	s, ok := decString(v)
	if !ok {
		return "", stringErr(path, "a string", v)
	}
	return s, nil
}

// stringErr is the error for a value at path that decString refused: a string that escapes a
// lone surrogate, or a value that is not a string (want says what it should have been).
func stringErr(path, want string, v []byte) *FieldError {
	if isString(v) {
		return fieldErr(path, `escapes a lone surrogate (\ud800-\udfff without its pair), which is no character`)
	}
	return typeErr(path, want, v)
}

// getInt decodes a present value that must be an integer.
func getInt(v []byte, path string) (int64, *FieldError) {
	n, msg := decInt(v)
	if msg != "" {
		if msg == errNotInt && !isNumber(v) {
			return 0, typeErr(path, "an integer", v)
		}
		return 0, fieldErr(path, msg)
	}
	return n, nil
}

// getFloat decodes a present value that must be a number.
func getFloat(v []byte, path string) (float64, *FieldError) {
	f, ok := decFloat(v)
	switch {
	case ok:
		return f, nil
	case isNumber(v): // 1e999: a number, past float64's range
		return 0, fieldErr(path, "is out of range")
	}
	return 0, typeErr(path, "a number", v)
}

// getBool decodes a present value that must be a boolean.
func getBool(v []byte, path string) (bool, *FieldError) {
	b, ok := decBool(v)
	if !ok {
		return false, typeErr(path, "true or false", v)
	}
	return b, nil
}

// intPtr decodes an optional integer into a new *int (nil when absent or null).
func intPtr(v []byte, path string) (*int, *FieldError) {
	if !present(v) {
		return nil, nil
	}
	n, fe := getInt(v, path)
	if fe != nil {
		return nil, fe
	}
	if n > int64(^uint(0)>>1) || n < -int64(^uint(0)>>1)-1 {
		return nil, fieldErr(path, errIntRange)
	}
	i := int(n)
	return &i, nil
}

// floatPtr decodes an optional number into a new *float64.
func floatPtr(v []byte, path string) (*float64, *FieldError) {
	if !present(v) {
		return nil, nil
	}
	f, fe := getFloat(v, path)
	if fe != nil {
		return nil, fe
	}
	return &f, nil
}

// int64Ptr decodes an optional integer into a new *int64.
func int64Ptr(v []byte, path string) (*int64, *FieldError) {
	if !present(v) {
		return nil, nil
	}
	n, fe := getInt(v, path)
	if fe != nil {
		return nil, fe
	}
	return &n, nil
}

// getEffort reads a reasoning effort: a string that Validate checks, but not "", which Validate
// would read as absent (medium) where the line asked for something else.
func getEffort(v []byte, path string) (string, *FieldError) {
	effort, fe := getString(v, path)
	if fe == nil && effort == "" {
		fe = fieldErr(path, `must be low, medium or high, not ""`)
	}
	return effort, fe
}

// dupKey and unknownKey are the two errors of a key walk.
func dupKey(path string) *FieldError { return fieldErr(path, "appears more than once") }

// nativeTopLevelHint explains an unknown top-level field of a native line, with a hint for the
// ones users commonly misplace.
func nativeTopLevelHint(key string) string {
	switch key {
	case "max_tokens", "temperature", "top_p", "top_k", "seed", "stop":
		return "unknown field (sampling parameters go in sampling_params)"
	case "n":
		return "unknown field (use num_samples)"
	}
	return "unknown field"
}

// parseNativeJob parses a native tinkerfleet line (or, with allowFormat, an encoded Job, which
// may also have format and openai_logprobs).
func parseNativeJob(b []byte, allowFormat bool) (Job, *FieldError) {
	var m nativeMembers
	if _, fe := m.read(b, allowFormat); fe != nil {
		return Job{}, fe
	}
	return m.job()
}

// nativeMembers are the values of the members of a native line (or an encoded Job), as read.
type nativeMembers struct {
	customID, format, model, modelPath, prompt, promptTokens, messages, thinking, effort,
	params, numSamples, promptLogprobs, topk, openaiLogprobs, metadata []byte
}

// read gathers the members of object b (with allowFormat, those of an encoded Job). Without
// allowFormat, it reports openai for a line with any of body, url or method, which is an
// OpenAI Batch API request, not a native line (parseLine): it meets them in the same pass
// over the members, so an unknown or repeated key is an error only once none follows.
func (r *nativeMembers) read(b []byte, allowFormat bool) (openai bool, fe *FieldError) {
	it := newObjIter(b)
	for k, v, ok := it.next(); ok; k, v, ok = it.next() {
		var dst *[]byte
		switch string(k) {
		case "custom_id":
			dst = &r.customID
		case "model":
			dst = &r.model
		case "model_path":
			dst = &r.modelPath
		case "prompt":
			dst = &r.prompt
		case "prompt_tokens":
			dst = &r.promptTokens
		case "messages":
			dst = &r.messages
		case "thinking":
			dst = &r.thinking
		case "reasoning_effort":
			dst = &r.effort
		case "sampling_params":
			dst = &r.params
		case "num_samples":
			dst = &r.numSamples
		case "prompt_logprobs":
			dst = &r.promptLogprobs
		case "topk_prompt_logprobs":
			dst = &r.topk
		case "metadata":
			dst = &r.metadata
		case "format":
			if allowFormat {
				dst = &r.format
			}
		case "openai_logprobs":
			if allowFormat {
				dst = &r.openaiLogprobs
			}
		case "body", "url", "method":
			if !allowFormat {
				return true, nil
			}
		}
		switch {
		case fe != nil: // the first is the one reported
		case dst == nil:
			fe = fieldErr(keyPath("", k), nativeTopLevelHint(string(k)))
		case *dst != nil:
			fe = dupKey(string(k))
		default:
			*dst = v
		}
	}
	return false, fe
}

// job decodes and checks the members' values (Job.validate checks the job as a whole).
func (r *nativeMembers) job() (Job, *FieldError) {
	j := Job{Format: FormatNative, NumSamples: 1}
	var fe *FieldError
	if !present(r.customID) {
		return Job{}, fieldErr("custom_id", "is required")
	}
	if j.CustomID, fe = getString(r.customID, "custom_id"); fe != nil {
		return Job{}, fe
	}
	if present(r.format) {
		if j.Format, fe = getString(r.format, "format"); fe != nil {
			return Job{}, fe
		}
	}
	if present(r.model) {
		if j.Model, fe = getString(r.model, "model"); fe != nil {
			return Job{}, fe
		}
		if j.Model == "" {
			return Job{}, fieldErr("model", "must not be empty")
		}
	}
	if present(r.modelPath) {
		if j.ModelPath, fe = getString(r.modelPath, "model_path"); fe != nil {
			return Job{}, fe
		}
		if j.ModelPath == "" {
			return Job{}, fieldErr("model_path", "must not be empty")
		}
	}
	if present(r.prompt) {
		if j.Prompt, fe = getString(r.prompt, "prompt"); fe != nil {
			return Job{}, fe
		}
		if j.Prompt == "" {
			return Job{}, fieldErr("prompt", "must not be empty")
		}
	}
	if present(r.promptTokens) {
		if j.PromptTokens, fe = parseTokens(r.promptTokens, "prompt_tokens"); fe != nil {
			return Job{}, fe
		}
	}
	if present(r.messages) {
		if j.Messages, fe = parseMessages(r.messages, "messages", false); fe != nil {
			return Job{}, fe
		}
	}
	if present(r.thinking) {
		if j.Thinking, fe = getBool(r.thinking, "thinking"); fe != nil {
			return Job{}, fe
		}
	}
	if present(r.effort) {
		if j.ReasoningEffort, fe = getEffort(r.effort, "reasoning_effort"); fe != nil {
			return Job{}, fe
		}
	}
	if present(r.params) {
		if j.Params, fe = parseParams(r.params); fe != nil {
			return Job{}, fe
		}
	}
	if present(r.numSamples) {
		n, fe := intPtr(r.numSamples, "num_samples")
		if fe != nil {
			return Job{}, fe
		}
		j.NumSamples = *n
	}
	if present(r.promptLogprobs) {
		if j.PromptLogprobs, fe = getBool(r.promptLogprobs, "prompt_logprobs"); fe != nil {
			return Job{}, fe
		}
	}
	if present(r.topk) {
		k, fe := intPtr(r.topk, "topk_prompt_logprobs")
		if fe != nil {
			return Job{}, fe
		}
		j.TopKPromptLogprobs = *k
	}
	if present(r.openaiLogprobs) {
		if j.OpenAILogprobs, fe = getBool(r.openaiLogprobs, "openai_logprobs"); fe != nil {
			return Job{}, fe
		}
	}
	if r.metadata != nil {
		j.Metadata = append(json.RawMessage(nil), r.metadata...)
	}
	return j, nil
}

// parseParams parses the native sampling_params object.
func parseParams(v []byte) (SamplingParams, *FieldError) {
	var p SamplingParams
	if !isObject(v) {
		return p, typeErr("sampling_params", "an object", v)
	}
	var seen [6]bool
	var fe *FieldError
	it := newObjIter(v)
	for k, val, ok := it.next(); ok; k, val, ok = it.next() {
		idx := -1
		switch string(k) {
		case "max_tokens":
			idx = 0
			p.MaxTokens, fe = intPtr(val, "sampling_params.max_tokens")
		case "temperature":
			idx = 1
			p.Temperature, fe = floatPtr(val, "sampling_params.temperature")
		case "top_p":
			idx = 2
			p.TopP, fe = floatPtr(val, "sampling_params.top_p")
		case "top_k":
			idx = 3
			p.TopK, fe = intPtr(val, "sampling_params.top_k")
		case "seed":
			idx = 4
			p.Seed, fe = int64Ptr(val, "sampling_params.seed")
		case "stop":
			idx = 5
			if present(val) {
				p.Stop, fe = parseStop(val, "sampling_params.stop")
			}
		default:
			return p, fieldErr(keyPath("sampling_params", k), "unknown field")
		}
		if seen[idx] {
			return p, dupKey("sampling_params." + string(k))
		}
		seen[idx] = true
		if fe != nil {
			return p, fe
		}
	}
	return p, nil
}

// parseStop parses a stop value: a string, a list of strings or a list of token ids (§T2).
func parseStop(v []byte, path string) (Stop, *FieldError) {
	var s Stop
	const want = "a string, a list of strings or a list of token ids"
	switch {
	case isString(v):
		str, fe := getString(v, path)
		if fe != nil {
			return s, fe
		}
		if str == "" { // named here: validation would name it stop[0], which is not in the line
			return s, fieldErr(path, "must not be an empty string")
		}
		s.Strings = []string{str}
		return s, nil
	case isArray(v):
	case isNull(v):
		return s, nil
	default:
		return s, typeErr(path, want, v)
	}
	it := newArrIter(v)
	i := 0
	for e, ok := it.next(); ok; e, ok = it.next() {
		ep := func() string { return elemPath(path, i, "") }
		switch {
		case isString(e):
			if len(s.TokenIDs) > 0 {
				return s, fieldErr(ep(), "must not mix stop strings and stop token ids")
			}
			str, fe := getString(e, ep())
			if fe != nil {
				return s, fe
			}
			s.Strings = append(s.Strings, str)
		case isNumber(e):
			if len(s.Strings) > 0 {
				return s, fieldErr(ep(), "must not mix stop strings and stop token ids")
			}
			n, msg := decInt(e)
			if msg != "" || n < 0 || n > maxTokenID {
				return s, fieldErr(ep(), "must be a token id (0 to 2147483647)")
			}
			s.TokenIDs = append(s.TokenIDs, int(n))
		default:
			return s, typeErr(ep(), "a string or a token id", e)
		}
		i++
	}
	return s, nil
}

// maxTokenID is the largest token id: token ids travel as int32 (§T4).
const maxTokenID = 1<<31 - 1

// parseTokens parses a non-empty list of token ids.
func parseTokens(v []byte, path string) ([]int, *FieldError) {
	if !isArray(v) {
		return nil, typeErr(path, "a list of token ids", v)
	}
	toks := make([]int, 0, arrayLen(v))
	it := newArrIter(v)
	for e, ok := it.next(); ok; e, ok = it.next() {
		n, msg := decInt(e)
		if msg != "" || n < 0 || n > maxTokenID {
			return nil, fieldErr(path+"["+strconv.Itoa(len(toks))+"]", "must be a token id (an integer from 0 to 2147483647), not "+string(truncate(e)))
		}
		toks = append(toks, int(n))
	}
	if len(toks) == 0 {
		return nil, fieldErr(path, "must not be empty")
	}
	return toks, nil
}

// truncate shortens a raw value for an error message, cut at a character's start.
func truncate(v []byte) []byte {
	if len(v) > 40 {
		cut := 37
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		return append(v[:cut:cut], "..."...)
	}
	return v
}

// parseMessages parses a non-empty chat message list. OpenAI lines may use the "developer" role
// (mapped to system) and content given as a list of text parts (joined with "\n", like vLLM).
func parseMessages(v []byte, path string, openai bool) ([]Message, *FieldError) {
	if !isArray(v) {
		return nil, typeErr(path, "a list of messages", v)
	}
	msgs := make([]Message, 0, arrayLen(v))
	it := newArrIter(v)
	for e, ok := it.next(); ok; e, ok = it.next() {
		i := len(msgs)
		mp := func(suffix string) string { return elemPath(path, i, suffix) }
		if !isObject(e) {
			return nil, typeErr(mp(""), "an object with role and content", e)
		}
		var role, content, name []byte
		mit := newObjIter(e)
		for k, val, ok := mit.next(); ok; k, val, ok = mit.next() {
			switch string(k) {
			case "role":
				if role != nil {
					return nil, dupKey(mp(".role"))
				}
				role = val
			case "content":
				if content != nil {
					return nil, dupKey(mp(".content"))
				}
				content = val
			case "name":
				if !openai {
					return nil, fieldErr(keyPath(mp(""), k), "unknown field (a message has only role and content)")
				}
				// OpenAI's participant name: the chat templates tinkerfleet renders (Qwen3,
				// Llama 3, DeepSeek V3.1, gpt-oss) have no place for it and leave it out, as
				// vLLM's server does with them. Checked as a string, then ignored.
				if name != nil {
					return nil, dupKey(mp(".name"))
				}
				name = val
				if present(val) {
					if _, fe := getString(val, mp(".name")); fe != nil {
						return nil, fe
					}
				}
			default:
				switch {
				case openai && isNull(val):
					continue // as OpenAI writes an answer's "refusal": null, which asks for nothing
				case openai:
					return nil, fieldErr(keyPath(mp(""), k), "unknown field (a message has only role, content and name)")
				}
				return nil, fieldErr(keyPath(mp(""), k), "unknown field (a message has only role and content)")
			}
		}
		var m Message
		var fe *FieldError
		if !present(role) {
			return nil, fieldErr(mp(".role"), "is required")
		}
		var ok bool
		if m.Role, ok = decString(role); !ok {
			return nil, stringErr(mp(".role"), "a string", role)
		}
		if openai && m.Role == "developer" {
			m.Role = RoleSystem
		}
		if !present(content) {
			return nil, fieldErr(mp(".content"), "is required")
		}
		if m.Content, fe = parseContent(content, path, i, openai); fe != nil {
			return nil, fe
		}
		msgs = append(msgs, m)
	}
	if len(msgs) == 0 {
		return nil, fieldErr(path, "must not be empty")
	}
	return msgs, nil
}

// elemPath returns path[i]suffix, for error messages.
func elemPath(path string, i int, suffix string) string {
	return path + "[" + strconv.Itoa(i) + "]" + suffix
}

// parseContent parses the content of message msg of msgsPath: a string, or in OpenAI lines a list of text parts.
func parseContent(v []byte, msgsPath string, msg int, openai bool) (string, *FieldError) {
	if s, ok := decString(v); ok {
		return s, nil
	}
	path := elemPath(msgsPath, msg, ".content")
	if !openai || isString(v) {
		return "", stringErr(path, "a string", v)
	}
	if !isArray(v) {
		return "", typeErr(path, "a string or a list of text parts", v)
	}
	var parts []string
	it := newArrIter(v)
	for e, ok := it.next(); ok; e, ok = it.next() {
		pp := path + "[" + strconv.Itoa(len(parts)) + "]"
		if !isObject(e) {
			return "", typeErr(pp, `an object {"type": "text", "text": ...}`, e)
		}
		var typ, text, unknown []byte
		pit := newObjIter(e)
		for k, val, ok := pit.next(); ok; k, val, ok = pit.next() {
			switch string(k) {
			case "type":
				if typ != nil {
					return "", dupKey(pp + ".type")
				}
				typ = val
			case "text":
				if text != nil {
					return "", dupKey(pp + ".text")
				}
				text = val
			default:
				if unknown == nil {
					unknown = k
				}
			}
		}
		if !present(typ) {
			return "", fieldErr(pp+".type", "is required")
		}
		t, fe := getString(typ, pp+".type")
		if fe != nil {
			return "", fe
		}
		if t != "text" {
			return "", fieldErr(pp+".type", "only text content parts are supported, not "+Excerpt(t))
		}
		if unknown != nil {
			return "", fieldErr(keyPath(pp, unknown), "unknown field (a text part has only type and text)")
		}
		if !present(text) {
			return "", fieldErr(pp+".text", "is required")
		}
		s, fe := getString(text, pp+".text")
		if fe != nil {
			return "", fe
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "\n"), nil
}

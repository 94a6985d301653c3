package jobs

import (
	"encoding/json"
	"strings"
)

// OpenAI Batch API endpoints accepted in the url field.
const (
	URLChatCompletions = "/v1/chat/completions"
	URLCompletions     = "/v1/completions"
)

// CompletionsDefaultMaxTokens is the max_tokens of a /v1/completions line that leaves it out
// (or null): OpenAI's documented default, which vLLM's server takes too. Without it the line
// would sample as many tokens as the Tinker service allows, not the 16 it asks for elsewhere.
// A chat line has no such default (OpenAI's is the rest of the context window).
const CompletionsDefaultMaxTokens = 16

// The rule for OpenAI body fields (also stated in schemas/job.schema.json):
//
//   - honoured: model, prompt (completions) / messages (chat), max_tokens (completions: 16
//     when absent or null, OpenAI's default),
//     max_completion_tokens (chat), temperature, top_p, top_k (a vLLM extension), n (→ num_samples),
//     stop, seed, metadata (kept as the job's metadata and returned in the result),
//     reasoning_effort (chat; low, medium or high, for gpt-oss, whose chat template takes it),
//     chat_template_kwargs (chat; vLLM's extension, only its thinking switch);
//   - honoured in the OpenAI-format result only: logprobs (chat: true; completions: 0, the
//     sampled tokens' logprobs without alternatives; Job.OpenAILogprobs), as a native result
//     always carries the sampled tokens' logprobs;
//   - ignored, because they only concern bookkeeping or delivery: user, store, service_tier,
//     safety_identifier, prompt_cache_key and prompt_cache_retention (what OpenAI now has in
//     place of user); and a message's name (a string), which the chat templates tinkerfleet
//     renders have no place for and leave out, as vLLM's server does with them;
//   - accepted only at their OpenAI default, because any other value changes what would be sampled
//     and Tinker cannot honour it: stream (false), frequency_penalty and presence_penalty (0),
//     logit_bias ({}), top_logprobs (0), echo (false), suffix (""),
//     best_of (1 or equal to n), response_format ({"type": "text"}), modalities (["text"]);
//   - everything else (tools, tool_choice, functions, audio, prediction, …) is
//     rejected with a field error naming body.<field>.

// openaiUnsupported is the message for body fields outside the rule above.
const openaiUnsupported = "is not supported: tinkerfleet cannot honour it (honoured: model, prompt or messages, " +
	"max_tokens, max_completion_tokens, temperature, top_p, top_k, n, stop, seed, metadata, reasoning_effort, " +
	"chat_template_kwargs)"

// parseOpenAI parses an OpenAI Batch API line.
func parseOpenAI(b []byte) (Job, fieldNames, *FieldError) {
	var customID, method, url, body []byte
	it := newObjIter(b)
	for k, v, ok := it.next(); ok; k, v, ok = it.next() {
		var dst *[]byte
		switch string(k) {
		case "custom_id":
			dst = &customID
		case "method":
			dst = &method
		case "url":
			dst = &url
		case "body":
			dst = &body
		default:
			return Job{}, fieldNames{}, fieldErr(keyPath("", k), "unknown field in an OpenAI batch line (it has custom_id, method, url and body; request parameters go in body)")
		}
		if *dst != nil {
			return Job{}, fieldNames{}, dupKey(string(k))
		}
		*dst = v
	}
	var j Job
	var fe *FieldError
	if !present(customID) {
		return Job{}, fieldNames{}, fieldErr("custom_id", "is required")
	}
	if j.CustomID, fe = getString(customID, "custom_id"); fe != nil {
		return Job{}, fieldNames{}, fe
	}
	if present(method) {
		m, fe := getString(method, "method")
		if fe != nil {
			return Job{}, fieldNames{}, fe
		}
		if m != "POST" {
			return Job{}, fieldNames{}, fieldErr("method", `must be "POST"`)
		}
	}
	if !present(url) {
		return Job{}, fieldNames{}, fieldErr("url", `is required ("/v1/completions" or "/v1/chat/completions")`)
	}
	u, fe := getString(url, "url")
	if fe != nil {
		return Job{}, fieldNames{}, fe
	}
	var chat bool
	switch u {
	case URLChatCompletions:
		chat = true
		j.Format = FormatOpenAIChat
	case URLCompletions:
		j.Format = FormatOpenAICompletions
	default:
		return Job{}, fieldNames{}, fieldErr("url", `must be "/v1/completions" or "/v1/chat/completions"`)
	}
	if !present(body) {
		return Job{}, fieldNames{}, fieldErr("body", "is required")
	}
	if !isObject(body) {
		return Job{}, fieldNames{}, typeErr("body", "an object", body)
	}
	names := openaiNames()
	j, fe = parseOpenAIBody(j, body, chat, &names)
	if fe != nil {
		return Job{}, fieldNames{}, fe
	}
	return j, names, nil
}

// parseOpenAIBody fills j from an OpenAI request body; it may rename names.maxTokens when the
// chat line used max_completion_tokens.
func parseOpenAIBody(j Job, body []byte, chat bool, names *fieldNames) (Job, *FieldError) {
	var model, prompt, messages, maxTokens, maxCompletion, temperature, topP, topK, n, stop, seed,
		metadata, bestOf, templateArgs, effort []byte
	var seen [32][]byte // keys so far, for duplicate detection (bodies have a handful of keys)
	nseen := 0
	var more map[string]bool // keys past the 32nd (null fields a client writes for every key)
	endpoint := URLCompletions
	other := URLChatCompletions
	if chat {
		endpoint, other = URLChatCompletions, URLCompletions
	}
	// A field of the other endpoint is refused, unless it is null, which asks for nothing.
	wrongEndpoint := func(k, v []byte) *FieldError {
		if isNull(v) {
			return nil
		}
		return fieldErr("body."+string(k), "is not valid for "+endpoint+" (it belongs to "+other+")")
	}
	it := newObjIter(body)
	for k, v, ok := it.next(); ok; k, v, ok = it.next() {
		for _, s := range seen[:nseen] {
			if string(s) == string(k) {
				return j, dupKey(keyPath("body", k))
			}
		}
		switch {
		case more[string(k)]:
			return j, dupKey(keyPath("body", k))
		case nseen < len(seen):
			seen[nseen] = k
			nseen++
		default:
			if more == nil {
				more = make(map[string]bool)
			}
			more[string(k)] = true
		}
		var fe *FieldError
		switch string(k) {
		case "model":
			model = v
		case "prompt":
			if chat {
				fe = wrongEndpoint(k, v)
				break
			}
			prompt = v
		case "messages":
			if !chat {
				fe = wrongEndpoint(k, v)
				break
			}
			messages = v
		case "max_tokens":
			maxTokens = v
		case "max_completion_tokens":
			if !chat {
				fe = wrongEndpoint(k, v)
				break
			}
			maxCompletion = v
		case "temperature":
			temperature = v
		case "top_p":
			topP = v
		case "top_k":
			topK = v
		case "n":
			n = v
		case "stop":
			stop = v
		case "seed":
			seed = v
		case "metadata":
			metadata = v
		case "user", "store", "service_tier", "safety_identifier", "prompt_cache_key", "prompt_cache_retention":
			// Bookkeeping only; ignored.
		case "logprobs":
			switch {
			case !present(v):
			case chat:
				j.OpenAILogprobs, fe = getBool(v, "body.logprobs")
			case isZeroNumber(v):
				j.OpenAILogprobs = true
			default:
				fe = fieldErr("body.logprobs", "must be 0 or null (0 returns each sampled token's logprob; "+
					"the top alternatives that a number above 0 asks for are not returned)")
			}
		case "top_logprobs":
			if !chat {
				fe = wrongEndpoint(k, v)
				break
			}
			fe = defaultOnly(v, k, isZeroNumber, "0 (per-token top alternatives are not returned)")
		case "stream":
			fe = defaultOnly(v, k, isFalse, "false (results are delivered as a batch)")
		case "frequency_penalty", "presence_penalty":
			fe = defaultOnly(v, k, isZeroNumber, "0 (Tinker has no penalties)")
		case "logit_bias":
			fe = defaultOnly(v, k, isEmptyObject, "{} (Tinker has no logit bias)")
		case "echo":
			if chat {
				fe = wrongEndpoint(k, v)
				break
			}
			fe = defaultOnly(v, k, isFalse, "false (use the native prompt_logprobs instead)")
		case "suffix":
			if chat {
				fe = wrongEndpoint(k, v)
				break
			}
			fe = defaultOnly(v, k, isEmptyString, `"" (Tinker has no insertion mode)`)
		case "best_of":
			if chat {
				fe = wrongEndpoint(k, v)
				break
			}
			bestOf = v
		case "chat_template_kwargs":
			if !chat {
				fe = wrongEndpoint(k, v)
				break
			}
			templateArgs = v
		case "reasoning_effort":
			if !chat {
				fe = wrongEndpoint(k, v)
				break
			}
			effort = v
		case "response_format":
			if !chat {
				fe = wrongEndpoint(k, v)
				break
			}
			fe = defaultOnly(v, k, isTextFormat, `{"type": "text"} (structured output is not supported)`)
		case "modalities":
			if !chat {
				fe = wrongEndpoint(k, v)
				break
			}
			fe = defaultOnly(v, k, isTextOnly, `["text"] (Tinker samples text)`)
		default:
			if isNull(v) {
				continue // null asks for nothing: what clients write for a field they leave unset
			}
			return j, fieldErr(keyPath("body", k), openaiUnsupported)
		}
		if fe != nil {
			return j, fe
		}
	}

	var fe *FieldError
	j.NumSamples = 1
	if !present(model) {
		return j, fieldErr("body.model", "is required")
	}
	m, fe := getString(model, "body.model")
	if fe != nil {
		return j, fe
	}
	if m == "" {
		return j, fieldErr("body.model", "must not be empty")
	}
	if strings.HasPrefix(m, "tinker://") {
		j.ModelPath = m
	} else {
		j.Model = m
	}
	if chat {
		if !present(messages) {
			return j, fieldErr("body.messages", "is required")
		}
		if j.Messages, fe = parseMessages(messages, "body.messages", true); fe != nil {
			return j, fe
		}
		if present(templateArgs) {
			if j.Thinking, fe = parseTemplateArgs(templateArgs); fe != nil {
				return j, fe
			}
		}
		if present(effort) {
			if j.ReasoningEffort, fe = getEffort(effort, "body.reasoning_effort"); fe != nil {
				return j, fe
			}
		}
	} else {
		if !present(prompt) {
			return j, fieldErr("body.prompt", "is required")
		}
		if j.Prompt, j.PromptTokens, fe = parseCompletionsPrompt(prompt); fe != nil {
			return j, fe
		}
	}
	if present(maxTokens) && present(maxCompletion) {
		return j, fieldErr("body.max_completion_tokens", "must not be set together with body.max_tokens")
	}
	if present(maxCompletion) {
		names.maxTokens = "body.max_completion_tokens"
		maxTokens = maxCompletion
	}
	if j.Params.MaxTokens, fe = intPtr(maxTokens, names.maxTokens); fe != nil {
		return j, fe
	}
	if j.Params.MaxTokens == nil && !chat {
		def := CompletionsDefaultMaxTokens
		j.Params.MaxTokens = &def
	}
	if j.Params.Temperature, fe = floatPtr(temperature, "body.temperature"); fe != nil {
		return j, fe
	}
	if j.Params.TopP, fe = floatPtr(topP, "body.top_p"); fe != nil {
		return j, fe
	}
	if j.Params.TopK, fe = intPtr(topK, "body.top_k"); fe != nil {
		return j, fe
	}
	if j.Params.TopK != nil && *j.Params.TopK == 0 {
		*j.Params.TopK = -1 // vLLM's "no limit", as -1 is (Tinker's, and vLLM's older one)
	}
	if j.Params.Seed, fe = int64Ptr(seed, "body.seed"); fe != nil {
		return j, fe
	}
	if present(stop) {
		if j.Params.Stop, fe = parseStop(stop, "body.stop"); fe != nil {
			return j, fe
		}
	}
	if present(n) {
		np, fe := intPtr(n, "body.n")
		if fe != nil {
			return j, fe
		}
		j.NumSamples = *np
	}
	if present(bestOf) {
		bo, fe := getInt(bestOf, "body.best_of")
		if fe != nil {
			return j, fe
		}
		if bo != 1 && bo != int64(j.NumSamples) {
			return j, fieldErr("body.best_of", "is only accepted when it is 1 or equal to n (Tinker cannot rank samples)")
		}
	}
	if metadata != nil {
		j.Metadata = append(json.RawMessage(nil), metadata...)
	}
	return j, nil
}

// parseCompletionsPrompt maps an OpenAI completions prompt: a string, a list of one string, a list
// of token ids, or a list of one list of token ids. Several prompts in one request are rejected.
func parseCompletionsPrompt(v []byte) (string, []int, *FieldError) {
	const path = "body.prompt"
	if isString(v) {
		s, fe := getString(v, path)
		if fe == nil && s == "" {
			fe = fieldErr(path, "must not be empty")
		}
		return s, nil, fe
	}
	if !isArray(v) {
		return "", nil, typeErr(path, "a string or a list of token ids", v)
	}
	it := newArrIter(v)
	first, ok := it.next()
	if !ok {
		return "", nil, fieldErr(path, "must not be empty")
	}
	if isNumber(first) {
		toks, fe := parseTokens(v, path)
		return "", toks, fe
	}
	if _, more := it.next(); more {
		return "", nil, fieldErr(path, "holds several prompts; put each prompt on its own line with its own custom_id")
	}
	switch {
	case isString(first):
		s, fe := getString(first, path+"[0]")
		if fe == nil && s == "" {
			fe = fieldErr(path+"[0]", "must not be empty")
		}
		return s, nil, fe
	case isArray(first):
		toks, fe := parseTokens(first, path+"[0]")
		return "", toks, fe
	}
	return "", nil, typeErr(path+"[0]", "a string or a list of token ids", first)
}

// defaultOnly accepts the value v of body.<key> when it is absent, null or satisfies isDefault.
func defaultOnly(v, key []byte, isDefault func([]byte) bool, want string) *FieldError {
	if !present(v) || isDefault(v) {
		return nil
	}
	return fieldErr("body."+string(key), "is only accepted at its default "+want)
}

func isFalse(v []byte) bool       { return string(v) == "false" }
func isEmptyString(v []byte) bool { return string(v) == `""` }

func isZeroNumber(v []byte) bool {
	f, ok := decFloat(v)
	return ok && f == 0
}

func isEmptyObject(v []byte) bool {
	if !isObject(v) {
		return false
	}
	it := newObjIter(v)
	_, _, ok := it.next()
	return !ok
}

// isTextOnly says v is the list ["text"]: OpenAI's default modalities.
func isTextOnly(v []byte) bool {
	if !isArray(v) {
		return false
	}
	it := newArrIter(v)
	first, ok := it.next()
	if !ok || string(first) != `"text"` {
		return false
	}
	_, more := it.next()
	return !more
}

func isTextFormat(v []byte) bool {
	if !isObject(v) {
		return false
	}
	it := newObjIter(v)
	n := 0
	for k, val, ok := it.next(); ok; k, val, ok = it.next() {
		if string(k) != "type" || string(val) != `"text"` {
			return false
		}
		n++
	}
	return n == 1
}

// parseTemplateArgs reads a chat line's chat_template_kwargs (vLLM's extension): the thinking
// switch, spelled enable_thinking (Qwen3) or thinking (DeepSeek V3.1), and nothing else.
func parseTemplateArgs(v []byte) (thinking bool, fe *FieldError) {
	if !isObject(v) {
		return false, typeErr("body.chat_template_kwargs", "an object", v)
	}
	var seen []byte // the spelling of the thinking switch met first
	it := newObjIter(v)
	for k, val, ok := it.next(); ok; k, val, ok = it.next() {
		path := keyPath("body.chat_template_kwargs", k)
		switch string(k) {
		case "enable_thinking", "thinking":
			switch {
			case string(seen) == string(k):
				return false, dupKey(path)
			case seen != nil:
				return false, fieldErr(path, "must not be set together with the other spelling of the thinking switch")
			}
			seen = k
			if present(val) {
				if thinking, fe = getBool(val, path); fe != nil {
					return false, fe
				}
			}
		default:
			return false, fieldErr(path, "is not supported (honoured: enable_thinking or thinking, the chat template's thinking switch)")
		}
	}
	return thinking, nil
}

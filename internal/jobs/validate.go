package jobs

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// fieldNames spells the job's fields the way its source format does, so that a validation error
// names the field the user wrote ("body.n", not "num_samples").
type fieldNames struct {
	customID, model, modelPath, prompt, promptTokens, messages, thinking, metadata string
	reasoningEffort, maxTokens, temperature, topP, topK, seed, stop                string
	numSamples, promptLogprobs, topKPromptLogprobs                                 string
}

// nativeNames are the paths of the native line (and of the encoded Job).
func nativeNames() fieldNames {
	return fieldNames{
		customID: "custom_id", model: "model", modelPath: "model_path", prompt: "prompt",
		promptTokens: "prompt_tokens", messages: "messages", thinking: "thinking", metadata: "metadata",
		reasoningEffort: "reasoning_effort",
		maxTokens:       "sampling_params.max_tokens", temperature: "sampling_params.temperature",
		topP: "sampling_params.top_p", topK: "sampling_params.top_k", seed: "sampling_params.seed",
		stop: "sampling_params.stop", numSamples: "num_samples", promptLogprobs: "prompt_logprobs",
		topKPromptLogprobs: "topk_prompt_logprobs",
	}
}

// openaiNames are the paths of an OpenAI line (both endpoints; a chat line that used
// max_completion_tokens renames maxTokens).
func openaiNames() fieldNames {
	return fieldNames{
		customID: "custom_id", model: "body.model", modelPath: "body.model", prompt: "body.prompt",
		promptTokens: "body.prompt", messages: "body.messages", metadata: "body.metadata",
		thinking: "body.chat_template_kwargs", reasoningEffort: "body.reasoning_effort",
		maxTokens: "body.max_tokens", temperature: "body.temperature", topP: "body.top_p",
		topK: "body.top_k", seed: "body.seed", stop: "body.stop", numSamples: "body.n",
		promptLogprobs: "prompt_logprobs", topKPromptLogprobs: "topk_prompt_logprobs",
	}
}

// namesFor returns the field names of a format (a value: the worker validates every job, and a
// pointer would put one on the heap each time).
func namesFor(format string) fieldNames {
	switch format {
	case FormatOpenAIChat, FormatOpenAICompletions:
		return openaiNames()
	default:
		return nativeNames()
	}
}

// Validate checks every field of the job against the format rules and the limits l (zero fields
// of l take their defaults). It returns a *FieldError naming the first offending field, spelled as
// in the job's source format. Readers call it on every line; the worker calls it again on every
// decoded message.
func (j *Job) Validate(l Limits) error {
	n := namesFor(j.Format)
	if fe := j.validate(l.withDefaults(), &n); fe != nil {
		return fe
	}
	return nil
}

// validate is Validate with resolved limits and explicit field names.
func (j *Job) validate(l Limits, n *fieldNames) *FieldError {
	switch j.Format {
	case "", FormatNative, FormatOpenAIChat, FormatOpenAICompletions:
	default:
		return fieldErr("format", "unknown format "+Excerpt(j.Format))
	}
	if fe := checkCustomID(j.CustomID, n.customID, l.MaxCustomIDLen); fe != nil {
		return fe
	}
	if fe := j.validateModel(n); fe != nil {
		return fe
	}
	if fe := j.validatePrompt(l, n); fe != nil {
		return fe
	}
	if fe := j.Params.validate(l, n); fe != nil {
		return fe
	}
	if j.NumSamples < 1 || j.NumSamples > l.MaxNumSamples {
		return fieldErr(n.numSamples, fmt.Sprintf("must be an integer from 1 to %d", l.MaxNumSamples))
	}
	if j.TopKPromptLogprobs < 0 || j.TopKPromptLogprobs > MaxTopKPromptLogprobs {
		return fieldErr(n.topKPromptLogprobs, fmt.Sprintf("must be an integer from 0 to %d (the server's cap, §3.6)", MaxTopKPromptLogprobs))
	}
	if j.Metadata != nil {
		if len(j.Metadata) > l.MaxMetadataBytes {
			return fieldErr(n.metadata, fmt.Sprintf("is %d bytes, over the limit of %d", len(j.Metadata), l.MaxMetadataBytes))
		}
		if !validJSON(j.Metadata) {
			return fieldErr(n.metadata, "must be valid JSON")
		}
	}
	return nil
}

// checkCustomID requires a non-empty id of at most max bytes without control characters (it
// becomes part of a NATS message id header).
func checkCustomID(id, path string, max int) *FieldError {
	if id == "" {
		return fieldErr(path, "must not be empty")
	}
	if len(id) > max {
		return fieldErr(path, fmt.Sprintf("is %d bytes, over the limit of %d", len(id), max))
	}
	if !utf8.ValidString(id) {
		return fieldErr(path, "must be valid UTF-8")
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fieldErr(path, "must not contain control characters")
		}
	}
	return nil
}

// validateModel requires exactly one of model and model_path (§3.5: model_path starts with
// tinker://).
func (j *Job) validateModel(n *fieldNames) *FieldError {
	switch {
	case j.Model == "" && j.ModelPath == "":
		if n.model == n.modelPath {
			return fieldErr(n.model, "is required")
		}
		return fieldErr(n.model, "is required (or model_path)")
	case j.Model != "" && j.ModelPath != "":
		return fieldErr(n.modelPath, "must not be set together with model")
	case j.Model != "":
		if len(j.Model) > maxModelLen || strings.IndexFunc(j.Model, badNameRune) >= 0 {
			return fieldErr(n.model, fmt.Sprintf("must be a model name without spaces or control characters, at most %d bytes", maxModelLen))
		}
	default:
		if !strings.HasPrefix(j.ModelPath, "tinker://") || len(j.ModelPath) == len("tinker://") {
			return fieldErr(n.modelPath, `must start with "tinker://"`)
		}
		if len(j.ModelPath) > maxModelLen || strings.IndexFunc(j.ModelPath, badNameRune) >= 0 {
			return fieldErr(n.modelPath, fmt.Sprintf("must not contain spaces or control characters and be at most %d bytes", maxModelLen))
		}
	}
	return nil
}

func badNameRune(r rune) bool {
	return unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError
}

// validatePrompt requires exactly one prompt kind within the limits.
func (j *Job) validatePrompt(l Limits, n *fieldNames) *FieldError {
	kinds := 0
	var second string
	for _, k := range []struct {
		set  bool
		name string
	}{{j.Prompt != "", n.prompt}, {len(j.PromptTokens) > 0, n.promptTokens}, {len(j.Messages) > 0, n.messages}} {
		if k.set {
			kinds++
			if kinds == 2 {
				second = k.name
			}
		}
	}
	switch kinds {
	case 0:
		if n.prompt == n.promptTokens {
			return fieldErr(n.prompt, "is required")
		}
		return fieldErr(n.prompt, "one of prompt, prompt_tokens or messages is required")
	case 1:
	default:
		return fieldErr(second, "exactly one of prompt, prompt_tokens and messages may be set")
	}
	// A string has no more characters than bytes: most are counted without a pass over them.
	if len(j.Prompt) > l.MaxPromptChars {
		if c := utf8.RuneCountInString(j.Prompt); c > l.MaxPromptChars {
			return fieldErr(n.prompt, fmt.Sprintf("is %d characters, over the limit of %d", c, l.MaxPromptChars))
		}
	}
	if len(j.PromptTokens) > l.MaxPromptTokens {
		return fieldErr(n.promptTokens, fmt.Sprintf("has %d tokens, over the limit of %d", len(j.PromptTokens), l.MaxPromptTokens))
	}
	for i, t := range j.PromptTokens {
		if t < 0 || t > maxTokenID {
			return fieldErr(n.promptTokens+"["+strconv.Itoa(i)+"]", "must be a token id (0 to 2147483647)")
		}
	}
	if j.Thinking && len(j.Messages) == 0 {
		return fieldErr(n.thinking, "applies to messages only (a chat template's thinking switch)")
	}
	if e := j.ReasoningEffort; e != "" {
		if e != "low" && e != "medium" && e != "high" {
			return fieldErr(n.reasoningEffort, "must be low, medium or high, not "+Excerpt(e))
		}
		if len(j.Messages) == 0 {
			return fieldErr(n.reasoningEffort, "applies to messages only (gpt-oss's chat template)")
		}
	}
	size := 0
	for i, m := range j.Messages {
		switch m.Role {
		case RoleSystem, RoleUser, RoleAssistant, RoleTool:
		default:
			return fieldErr(n.messages+"["+strconv.Itoa(i)+"].role",
				"must be system, user, assistant or tool, not "+Excerpt(m.Role))
		}
		size += len(m.Content)
	}
	if size > l.MaxPromptChars { // characters are counted only where bytes could be over
		chars := 0
		for _, m := range j.Messages {
			chars += utf8.RuneCountInString(m.Content)
		}
		if chars > l.MaxPromptChars {
			return fieldErr(n.messages, fmt.Sprintf("hold %d characters of content, over the limit of %d", chars, l.MaxPromptChars))
		}
	}
	return nil
}

// validate checks the sampling parameters (§T2).
func (p *SamplingParams) validate(l Limits, n *fieldNames) *FieldError {
	if p.MaxTokens != nil && (*p.MaxTokens < 1 || *p.MaxTokens > l.MaxMaxTokens) {
		return fieldErr(n.maxTokens, fmt.Sprintf("must be a positive integer of at most %d", l.MaxMaxTokens))
	}
	if p.Temperature != nil && !(*p.Temperature >= 0 && !math.IsInf(*p.Temperature, 1)) {
		return fieldErr(n.temperature, "must be a number >= 0")
	}
	if p.TopP != nil && !(*p.TopP > 0 && *p.TopP <= 1) {
		return fieldErr(n.topP, "must be a number in (0, 1]")
	}
	if p.TopK != nil && *p.TopK != -1 && *p.TopK < 1 {
		return fieldErr(n.topK, "must be -1 (no limit) or an integer >= 1")
	}
	if len(p.Stop.Strings) > 0 && len(p.Stop.TokenIDs) > 0 {
		return fieldErr(n.stop, "must not mix stop strings and stop token ids")
	}
	for i, s := range p.Stop.Strings {
		if s == "" {
			return fieldErr(n.stop+"["+strconv.Itoa(i)+"]", "must not be an empty string")
		}
	}
	for i, t := range p.Stop.TokenIDs {
		if t < 0 || t > maxTokenID {
			return fieldErr(n.stop+"["+strconv.Itoa(i)+"]", "must be a token id (0 to 2147483647)")
		}
	}
	return nil
}

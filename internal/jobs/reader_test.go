package jobs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"unicode"
)

const (
	goodA = `{"custom_id":"good-a","model":"Qwen/Qwen3-8B","prompt":"hello"}`
	goodB = `{"custom_id":"good-b","model":"Qwen/Qwen3-8B","prompt":"world"}`
)

// TestReaderBadLines puts each kind of bad line between two good ones and checks that the error
// names file, line and field, and that the reader goes on with the next line.
func TestReaderBadLines(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 300)
	tests := []struct {
		name   string
		line   string
		limits Limits
		field  string
		msg    string
	}{
		{"invalid utf8", "{\"custom_id\":\"x\xff\xfe\",\"model\":\"m\",\"prompt\":\"p\"}", Limits{}, "", "invalid UTF-8 at byte 16"},
		{"malformed json", `{"custom_id":"x","model":"m",`, Limits{}, "", "malformed JSON"},
		{"trailing garbage", `{"custom_id":"x","model":"m","prompt":"p"} {}`, Limits{}, "", "malformed JSON"},
		{"not an object", `"just a string"`, Limits{}, "", "must be a JSON object, not a string"},
		{"array line", `[1,2]`, Limits{}, "", "not an array"},
		{"missing custom_id", `{"model":"m","prompt":"p"}`, Limits{}, "custom_id", "is required"},
		{"null custom_id", `{"custom_id":null,"model":"m","prompt":"p"}`, Limits{}, "custom_id", "is required"},
		{"custom_id number", `{"custom_id":7,"model":"m","prompt":"p"}`, Limits{}, "custom_id", "must be a string, not a number"},
		{"custom_id empty", `{"custom_id":"","model":"m","prompt":"p"}`, Limits{}, "custom_id", "must not be empty"},
		{"custom_id control", `{"custom_id":"a\nb","model":"m","prompt":"p"}`, Limits{}, "custom_id", "control characters"},
		{"custom_id too long", `{"custom_id":"` + long + `","model":"m","prompt":"p"}`, Limits{}, "custom_id", "is 300 bytes, over the limit of 256"},
		{"unknown field", `{"custom_id":"x","model":"m","prompt":"p","colour":"red","zzz":1}`, Limits{}, "colour", "unknown field"},
		{"misplaced param", `{"custom_id":"x","model":"m","prompt":"p","temperature":1}`, Limits{}, "temperature", "go in sampling_params"},
		{"n instead of num_samples", `{"custom_id":"x","model":"m","prompt":"p","n":2}`, Limits{}, "n", "use num_samples"},
		{"thinking without messages", `{"custom_id":"x","model":"m","prompt":"p","thinking":true}`, Limits{}, "thinking", "applies to messages only"},
		{"thinking not a boolean", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"c"}],"thinking":"yes"}`, Limits{}, "thinking", "must be true or false, not a string"},
		{"reasoning effort without messages", `{"custom_id":"x","model":"m","prompt":"p","reasoning_effort":"low"}`, Limits{}, "reasoning_effort", "applies to messages only"},
		{"reasoning effort unknown", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"c"}],"reasoning_effort":"minimal"}`, Limits{}, "reasoning_effort", `must be low, medium or high, not "minimal"`},
		{"reasoning effort not a string", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"c"}],"reasoning_effort":2}`, Limits{}, "reasoning_effort", "must be a string, not a number"},
		{"openai reasoning effort unknown", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"reasoning_effort":"max"}}`, Limits{}, "body.reasoning_effort", "must be low, medium or high"},
		{"reasoning effort empty", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"c"}],"reasoning_effort":""}`, Limits{}, "reasoning_effort", `must be low, medium or high, not ""`},
		{"openai line with an unknown key before url", `{"custom_id":"x","colour":"red","url":"/v1/completions","body":{"model":"m","prompt":"p"}}`, Limits{}, "colour", "unknown field in an OpenAI batch line"},
		{"openai line with a repeated key before body", `{"custom_id":"x","model":"m","model":"n","body":{"model":"m","prompt":"p"},"url":"/v1/completions"}`, Limits{}, "model", "unknown field in an OpenAI batch line"},
		{"openai reasoning effort empty", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"reasoning_effort":""}}`, Limits{}, "body.reasoning_effort", `must be low, medium or high, not ""`},
		{"openai duplicate key after 40 others", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","f0":null,"f1":null,"f2":null,"f3":null,"f4":null,"f5":null,"f6":null,"f7":null,"f8":null,"f9":null,"f10":null,"f11":null,"f12":null,"f13":null,"f14":null,"f15":null,"f16":null,"f17":null,"f18":null,"f19":null,"f20":null,"f21":null,"f22":null,"f23":null,"f24":null,"f25":null,"f26":null,"f27":null,"f28":null,"f29":null,"f30":null,"f31":null,"f32":null,"f33":null,"f34":null,"f35":null,"f36":null,"f37":null,"f38":null,"f39":null,"temperature":1,"temperature":5}}`, Limits{}, "body.temperature", "appears more than once"},
		{"openai reasoning effort on completions", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","reasoning_effort":"low"}}`, Limits{}, "body.reasoning_effort", "is not valid for /v1/completions"},
		{"openai template argument unknown", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"chat_template_kwargs":{"tools_in_user":true}}}`, Limits{}, "body.chat_template_kwargs.tools_in_user", "is not supported"},
		{"openai thinking switch twice", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"chat_template_kwargs":{"enable_thinking":true,"thinking":false}}}`, Limits{}, "body.chat_template_kwargs.thinking", "other spelling"},
		{"openai thinking switch repeated", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"chat_template_kwargs":{"enable_thinking":true,"enable_thinking":false}}}`, Limits{}, "body.chat_template_kwargs.enable_thinking", "appears more than once"},
		{"openai template arguments on completions", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","chat_template_kwargs":{"enable_thinking":true}}}`, Limits{}, "body.chat_template_kwargs", "is not valid for /v1/completions"},
		{"format not allowed in lines", `{"custom_id":"x","model":"m","prompt":"p","format":"tinkerfleet"}`, Limits{}, "format", "unknown field"},
		{"openai_logprobs not allowed in lines", `{"custom_id":"x","model":"m","prompt":"p","openai_logprobs":true}`, Limits{}, "openai_logprobs", "unknown field"},
		{"duplicate key", `{"custom_id":"x","model":"m","model":"n","prompt":"p"}`, Limits{}, "model", "appears more than once"},
		{"escaped duplicate key", `{"custom_id":"x","custom\u005fid":"y","model":"m","prompt":"p"}`, Limits{}, "custom_id", "appears more than once"},
		{"mistyped temperature", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"temperature":"hot"}}`, Limits{}, "sampling_params.temperature", "must be a number, not a string"},
		{"mistyped max_tokens float", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"max_tokens":1.5}}`, Limits{}, "sampling_params.max_tokens", "must be an integer"},
		{"max_tokens zero", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"max_tokens":0}}`, Limits{}, "sampling_params.max_tokens", "must be a positive integer"},
		{"max_tokens over limit", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"max_tokens":101}}`, Limits{MaxMaxTokens: 100}, "sampling_params.max_tokens", "at most 100"},
		{"temperature negative", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"temperature":-1}}`, Limits{}, "sampling_params.temperature", ">= 0"},
		{"top_p zero", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"top_p":0}}`, Limits{}, "sampling_params.top_p", "(0, 1]"},
		{"top_p above one", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"top_p":1.01}}`, Limits{}, "sampling_params.top_p", "(0, 1]"},
		{"top_k zero", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"top_k":0}}`, Limits{}, "sampling_params.top_k", "-1 (no limit)"},
		{"top_k minus two", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"top_k":-2}}`, Limits{}, "sampling_params.top_k", "-1 (no limit)"},
		{"seed overflow", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"seed":9223372036854775808}}`, Limits{}, "sampling_params.seed", "out of range"},
		{"seed string", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"seed":"1"}}`, Limits{}, "sampling_params.seed", "must be an integer, not a string"},
		{"stop mixed", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"stop":[1,"a"]}}`, Limits{}, "sampling_params.stop[1]", "must not mix"},
		{"stop empty string", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"stop":["a",""]}}`, Limits{}, "sampling_params.stop[1]", "must not be an empty string"},
		{"stop negative id", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"stop":[-1]}}`, Limits{}, "sampling_params.stop[0]", "token id"},
		{"stop object", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"stop":{"a":1}}}`, Limits{}, "sampling_params.stop", "must be a string, a list of strings or a list of token ids, not an object"},
		{"params not object", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":[1]}`, Limits{}, "sampling_params", "must be an object"},
		{"unknown param", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"min_p":0.1}}`, Limits{}, "sampling_params.min_p", "unknown field"},
		{"duplicate param", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"seed":1,"seed":2}}`, Limits{}, "sampling_params.seed", "appears more than once"},
		{"both models", `{"custom_id":"x","model":"m","model_path":"tinker://a/b","prompt":"p"}`, Limits{}, "model_path", "together with model"},
		{"no model", `{"custom_id":"x","prompt":"p"}`, Limits{}, "model", "is required (or model_path)"},
		{"empty model", `{"custom_id":"x","model":"","prompt":"p"}`, Limits{}, "model", "must not be empty"},
		{"model with space", `{"custom_id":"x","model":"Qwen 3","prompt":"p"}`, Limits{}, "model", "without spaces"},
		{"model_path scheme", `{"custom_id":"x","model_path":"https://a/b","prompt":"p"}`, Limits{}, "model_path", `must start with "tinker://"`},
		{"model_path bare", `{"custom_id":"x","model_path":"tinker://","prompt":"p"}`, Limits{}, "model_path", `must start with "tinker://"`},
		{"no prompt", `{"custom_id":"x","model":"m"}`, Limits{}, "prompt", "one of prompt, prompt_tokens or messages is required"},
		{"two prompts", `{"custom_id":"x","model":"m","prompt":"p","prompt_tokens":[1]}`, Limits{}, "prompt_tokens", "exactly one of"},
		{"three prompts", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"c"}],"prompt":"p","prompt_tokens":[1]}`, Limits{}, "prompt_tokens", "exactly one of"},
		{"empty prompt", `{"custom_id":"x","model":"m","prompt":""}`, Limits{}, "prompt", "must not be empty"},
		{"prompt too long", `{"custom_id":"x","model":"m","prompt":"ééééé!"}`, Limits{MaxPromptChars: 5}, "prompt", "is 6 characters, over the limit of 5"},
		{"empty tokens", `{"custom_id":"x","model":"m","prompt_tokens":[]}`, Limits{}, "prompt_tokens", "must not be empty"},
		{"token string", `{"custom_id":"x","model":"m","prompt_tokens":[1,"2"]}`, Limits{}, "prompt_tokens[1]", "must be a token id"},
		{"token too big", `{"custom_id":"x","model":"m","prompt_tokens":[2147483648]}`, Limits{}, "prompt_tokens[0]", "must be a token id"},
		{"tokens too many", `{"custom_id":"x","model":"m","prompt_tokens":[1,2,3]}`, Limits{MaxPromptTokens: 2}, "prompt_tokens", "has 3 tokens, over the limit of 2"},
		{"tokens not array", `{"custom_id":"x","model":"m","prompt_tokens":"1 2"}`, Limits{}, "prompt_tokens", "must be a list of token ids, not a string"},
		{"messages empty", `{"custom_id":"x","model":"m","messages":[]}`, Limits{}, "messages", "must not be empty"},
		{"message bad role", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"a"},{"role":"bot","content":"b"}]}`, Limits{}, "messages[1].role", `not "bot"`},
		{"developer only in openai", `{"custom_id":"x","model":"m","messages":[{"role":"developer","content":"a"}]}`, Limits{}, "messages[0].role", `not "developer"`},
		{"message no content", `{"custom_id":"x","model":"m","messages":[{"role":"user"}]}`, Limits{}, "messages[0].content", "is required"},
		{"message parts not native", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`, Limits{}, "messages[0].content", "must be a string, not an array"},
		{"message extra field", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"a","name":"bob"}]}`, Limits{}, "messages[0].name", "unknown field"},
		{"message not object", `{"custom_id":"x","model":"m","messages":["hi"]}`, Limits{}, "messages[0]", "must be an object"},
		{"messages too long", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"abc"},{"role":"user","content":"def"}]}`, Limits{MaxPromptChars: 5}, "messages", "6 characters of content"},
		{"num_samples zero", `{"custom_id":"x","model":"m","prompt":"p","num_samples":0}`, Limits{}, "num_samples", "from 1 to 16"},
		{"num_samples over", `{"custom_id":"x","model":"m","prompt":"p","num_samples":5}`, Limits{MaxNumSamples: 4}, "num_samples", "from 1 to 4"},
		{"prompt_logprobs string", `{"custom_id":"x","model":"m","prompt":"p","prompt_logprobs":"yes"}`, Limits{}, "prompt_logprobs", "must be true or false, not a string"},
		{"topk over cap", `{"custom_id":"x","model":"m","prompt":"p","topk_prompt_logprobs":21}`, Limits{}, "topk_prompt_logprobs", "from 0 to 20"},
		{"topk negative", `{"custom_id":"x","model":"m","prompt":"p","topk_prompt_logprobs":-1}`, Limits{}, "topk_prompt_logprobs", "from 0 to 20"},
		{"metadata too big", `{"custom_id":"x","model":"m","prompt":"p","metadata":{"k":"0123456789"}}`, Limits{MaxMetadataBytes: 10}, "metadata", "over the limit of 10"},
		// OpenAI lines.
		{"oai missing url", `{"custom_id":"x","method":"POST","body":{"model":"m","prompt":"p"}}`, Limits{}, "url", "is required"},
		{"oai bad url", `{"custom_id":"x","url":"/v1/embeddings","body":{"model":"m","input":"p"}}`, Limits{}, "url", `must be "/v1/completions" or "/v1/chat/completions"`},
		{"oai bad method", `{"custom_id":"x","method":"PUT","url":"/v1/completions","body":{"model":"m","prompt":"p"}}`, Limits{}, "method", `must be "POST"`},
		{"oai missing body", `{"custom_id":"x","method":"POST","url":"/v1/completions"}`, Limits{}, "body", "is required"},
		{"oai body not object", `{"custom_id":"x","url":"/v1/completions","body":"p"}`, Limits{}, "body", "must be an object, not a string"},
		{"oai missing custom_id", `{"url":"/v1/completions","body":{"model":"m","prompt":"p"}}`, Limits{}, "custom_id", "is required"},
		{"oai native field on top", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p"},"metadata":{}}`, Limits{}, "metadata", "request parameters go in body"},
		{"oai missing model", `{"custom_id":"x","url":"/v1/completions","body":{"prompt":"p"}}`, Limits{}, "body.model", "is required"},
		{"oai missing prompt", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m"}}`, Limits{}, "body.prompt", "is required"},
		{"oai missing messages", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m"}}`, Limits{}, "body.messages", "is required"},
		{"oai prompt in chat", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","prompt":"p"}}`, Limits{}, "body.prompt", "not valid for /v1/chat/completions"},
		{"oai max_completion_tokens in completions", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","max_completion_tokens":5}}`, Limits{}, "body.max_completion_tokens", "not valid for /v1/completions"},
		{"oai both max", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"max_tokens":5,"max_completion_tokens":5}}`, Limits{}, "body.max_completion_tokens", "together with body.max_tokens"},
		{"oai max_completion_tokens zero", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"max_completion_tokens":0}}`, Limits{}, "body.max_completion_tokens", "positive integer"},
		{"oai n zero", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","n":0}}`, Limits{}, "body.n", "from 1 to 16"},
		{"oai temperature type", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","temperature":"1"}}`, Limits{}, "body.temperature", "must be a number"},
		{"oai top_p range", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","top_p":2}}`, Limits{}, "body.top_p", "(0, 1]"},
		{"empty stop string", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"stop":""}}`, Limits{}, "sampling_params.stop", "must not be an empty string"},
		{"empty stop string in a list", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"stop":["a",""]}}`, Limits{}, "sampling_params.stop[1]", "must not be an empty string"},
		{"oai empty stop string", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","stop":""}}`, Limits{}, "body.stop", "must not be an empty string"},
		{"lone high surrogate in custom_id", `{"custom_id":"x\ud800","model":"m","prompt":"p"}`, Limits{}, "custom_id", "lone surrogate"},
		{"lone low surrogate in prompt", `{"custom_id":"x","model":"m","prompt":"\udc00\ud83d\ude00"}`, Limits{}, "prompt", "lone surrogate"},
		{"high surrogate before another escape", `{"custom_id":"x","model":"m","prompt":"\ud83d\n"}`, Limits{}, "prompt", "lone surrogate"},
		{"two high surrogates", `{"custom_id":"x","model":"m","prompt":"\ud83d\ud83d\ude00"}`, Limits{}, "prompt", "lone surrogate"},
		{"lone surrogate in a stop string", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"stop":["a","\udfff"]}}`, Limits{}, "sampling_params.stop[1]", "lone surrogate"},
		{"lone surrogate in a role", `{"custom_id":"x","model":"m","messages":[{"role":"user\ud800","content":"a"}]}`, Limits{}, "messages[0].role", "lone surrogate"},
		{"lone surrogate in content", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"a\ud800"}]}`, Limits{}, "messages[0].content", "lone surrogate"},
		{"oai lone surrogate in content", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"a\ud800"}]}}`, Limits{}, "body.messages[0].content", "lone surrogate"},
		{"temperature past float64", `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"temperature":1e999}}`, Limits{}, "sampling_params.temperature", "is out of range"},
		{"oai tools", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"tools":[]}}`, Limits{}, "body.tools", "is not supported"},
		{"oai unsupported names all it honours", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"tools":[]}}`, Limits{}, "body.tools", "reasoning_effort, chat_template_kwargs)"},
		{"oai logit_bias", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"logit_bias":{"1":5}}}`, Limits{}, "body.logit_bias", "only accepted at its default {}"},
		{"oai penalty", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","presence_penalty":0.5}}`, Limits{}, "body.presence_penalty", "only accepted at its default 0"},
		{"oai stream", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","stream":true}}`, Limits{}, "body.stream", "default false"},
		{"oai echo", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","echo":true}}`, Limits{}, "body.echo", "default false"},
		{"oai suffix", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","suffix":"end"}}`, Limits{}, "body.suffix", "only accepted at its default"},
		{"oai completions logprobs", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","logprobs":5}}`, Limits{}, "body.logprobs", "must be 0 or null (0 returns each sampled token's logprob"},
		{"oai completions logprobs type", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","logprobs":true}}`, Limits{}, "body.logprobs", "must be 0 or null"},
		{"oai chat logprobs type", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"logprobs":1}}`, Limits{}, "body.logprobs", "must be true or false"},
		{"oai top_logprobs", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"top_logprobs":3}}`, Limits{}, "body.top_logprobs", "only accepted at its default 0"},
		{"oai best_of", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","best_of":3,"n":2}}`, Limits{}, "body.best_of", "1 or equal to n"},
		{"oai modalities", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"modalities":["text","audio"]}}`, Limits{}, "body.modalities", `only accepted at its default ["text"]`},
		{"oai modalities on completions", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"c","modalities":["text"]}}`, Limits{}, "body.modalities", "/v1/chat/completions"},
		{"oai response_format", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c"}],"response_format":{"type":"json_object"}}}`, Limits{}, "body.response_format", "structured output"},
		{"oai several prompts", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":["a","b"]}}`, Limits{}, "body.prompt", "several prompts"},
		{"oai several token prompts", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":[[1],[2]]}}`, Limits{}, "body.prompt", "several prompts"},
		{"oai empty prompt list", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":[]}}`, Limits{}, "body.prompt", "must not be empty"},
		{"oai prompt bad token", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":[1,-5]}}`, Limits{}, "body.prompt[1]", "must be a token id"},
		{"oai image part", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}}`, Limits{}, "body.messages[0].content[0].type", "only text content parts"},
		{"oai text part with two texts", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"one","text":"two"}]}]}}`, Limits{}, "body.messages[0].content[0].text", "appears more than once"},
		{"oai part typed twice", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","type":"text","text":"x"}]}]}}`, Limits{}, "body.messages[0].content[0].type", "appears more than once"},
		{"oai unknown message field", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c","refusal":"no"}]}}`, Limits{}, "body.messages[0].refusal", "unknown field (a message has only role, content and name)"},
		{"oai message name type", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c","name":5}]}}`, Limits{}, "body.messages[0].name", "must be a string"},
		{"oai message name twice", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"c","name":"a","name":"b"}]}}`, Limits{}, "body.messages[0].name", "appears more than once"},
		{"native message name", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"c","name":"a"}]}`, Limits{}, "messages[0].name", "unknown field"},
		{"native message field null", `{"custom_id":"x","model":"m","messages":[{"role":"user","content":"c","refusal":null}]}`, Limits{}, "messages[0].refusal", "unknown field"},
		{"oai tool_calls", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"assistant","content":"c","tool_calls":[]}]}}`, Limits{}, "body.messages[0].tool_calls", "unknown field"},
		{"oai bad role", `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"function","content":"c"}]}}`, Limits{}, "body.messages[0].role", `not "function"`},
		{"oai duplicate body key", `{"custom_id":"x","url":"/v1/completions","body":{"model":"m","prompt":"p","seed":1,"seed":2}}`, Limits{}, "body.seed", "appears more than once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := goodA + "\n" + tt.line + "\n" + goodB + "\n"
			items, err := readString(t, in, tt.limits)
			mustEOF(t, err)
			if len(items) != 3 {
				t.Fatalf("got %d outcomes, want 3: %+v", len(items), items)
			}
			if items[0].lerr != nil || items[0].job.CustomID != "good-a" {
				t.Fatalf("line 1: %+v", items[0])
			}
			le := items[1].lerr
			if le == nil {
				j, _ := items[1].job.Encode()
				t.Fatalf("line 2 accepted: %s", j)
			}
			if le.File != "t.jsonl" || le.Line != 2 || le.Field != tt.field || !strings.Contains(le.Msg, tt.msg) {
				t.Errorf("got %q (field %q), want field %q and message containing %q", le.Error(), le.Field, tt.field, tt.msg)
			}
			wantPrefix := "t.jsonl:2: "
			if tt.field != "" {
				wantPrefix += "field " + tt.field + ": "
			}
			if !strings.HasPrefix(le.Error(), wantPrefix) {
				t.Errorf("Error() = %q, want prefix %q", le.Error(), wantPrefix)
			}
			if items[2].lerr != nil || items[2].job.CustomID != "good-b" || items[2].line != 3 {
				t.Fatalf("line 3 after the bad line: %+v", items[2])
			}
		})
	}
}

func TestLineErrorFormat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		e    LineError
		want string
	}{
		{LineError{File: "prompts.jsonl", Line: 12, Field: "sampling_params.max_tokens", Msg: "must be a positive integer"},
			"prompts.jsonl:12: field sampling_params.max_tokens: must be a positive integer"},
		{LineError{File: "p.jsonl", Line: 3, Msg: "malformed JSON"}, "p.jsonl:3: malformed JSON"},
		{LineError{Line: 4, Field: "model", Msg: "is required"}, "line 4: field model: is required"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestReaderDuplicateCustomID(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		goodA,
		`{"custom_id":"dup","model":"m","prompt":"bad","num_samples":0}`, // invalid: does not claim the id
		`{"custom_id":"dup","model":"m","prompt":"first"}`,
		goodB,
		`{"custom_id":"dup","url":"/v1/completions","body":{"model":"m","prompt":"again"}}`,
		`{"custom_id":"good-a","model":"m","prompt":"again"}`,
	}, "\n")
	items, err := readString(t, in, Limits{})
	mustEOF(t, err)
	want := []struct {
		id  string
		err string
	}{
		{"good-a", ""},
		{"", "t.jsonl:2: field num_samples"},
		{"dup", ""},
		{"good-b", ""},
		{"", `t.jsonl:5: field custom_id: duplicate "dup" (first used on line 3)`},
		{"", `t.jsonl:6: field custom_id: duplicate "good-a" (first used on line 1)`},
	}
	if len(items) != len(want) {
		t.Fatalf("got %d outcomes, want %d", len(items), len(want))
	}
	for i, w := range want {
		switch {
		case w.err == "" && (items[i].lerr != nil || items[i].job.CustomID != w.id):
			t.Errorf("line %d: got %+v, want job %q", i+1, items[i], w.id)
		case w.err != "" && (items[i].lerr == nil || !strings.HasPrefix(items[i].lerr.Error(), w.err)):
			t.Errorf("line %d: got %+v, want error %q", i+1, items[i], w.err)
		}
	}
}

// TestReaderKeepsEscapedCharacters: surrogate pairs and U+FFFD, escaped or written, are
// characters, and strings that differ stay different (the lone surrogate check must not take
// them for one).
func TestReaderKeepsEscapedCharacters(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"custom_id":"a\ud83d\ude00","model":"m","prompt":"\ud83d\ude00\ufffd\n"}`,
		`{"custom_id":"a\ufffd","model":"m","prompt":"\uD83D\uDE00x"}`,
		`{"custom_id":"a�\u00e9","model":"m","prompt":"\u00e9\ud800\udc00"}`,
	}, "\n")
	items, err := readString(t, in, Limits{})
	mustEOF(t, err)
	want := []struct{ id, prompt string }{
		{"a😀", "😀\uFFFD\n"},
		{"a\uFFFD", "😀x"},
		{"a\uFFFDé", "é\U00010000"},
	}
	if len(items) != len(want) {
		t.Fatalf("got %d outcomes, want %d", len(items), len(want))
	}
	for i, w := range want {
		if items[i].lerr != nil || items[i].job.CustomID != w.id || items[i].job.Prompt != w.prompt {
			t.Errorf("line %d: got %+v, want id %q prompt %q", i+1, items[i], w.id, w.prompt)
		}
	}
}

func TestIDSetCollision(t *testing.T) {
	t.Parallel()
	var shard idShard
	if _, dup := shard.add(42, "alpha", 1); dup {
		t.Fatal("first add reported a duplicate")
	}
	// Another id of the same hash.
	if _, dup := shard.add(42, "beta", 2); dup {
		t.Fatal("a different id with the same hash was reported as a duplicate")
	}
	if first, dup := shard.add(42, "beta", 3); !dup || first != 2 {
		t.Fatalf("second beta: first=%d dup=%v, want 2 true", first, dup)
	}
	if first, dup := shard.add(42, "alpha", 4); !dup || first != 1 {
		t.Fatalf("second alpha: first=%d dup=%v, want 1 true", first, dup)
	}
	// Forgetting an id (Reader.NextFile): the one in the index, whose place the other of its
	// hash takes, then one in the overflow.
	hash := func(id string) uint64 { return map[string]uint64{"alpha": 42, "beta": 42, "gamma": 42}[id] }
	shard.remove(42, "alpha", hash)
	if first, dup := shard.add(42, "beta", 5); !dup || first != 2 {
		t.Fatalf("beta after alpha was forgotten: first=%d dup=%v, want 2 true", first, dup)
	}
	if _, dup := shard.add(42, "alpha", 6); dup {
		t.Fatal("alpha was forgotten, but a new alpha is a duplicate")
	}
	shard.add(42, "gamma", 7)
	shard.remove(42, "gamma", hash)
	if _, dup := shard.add(42, "gamma", 8); dup {
		t.Fatal("gamma was forgotten, but a new gamma is a duplicate")
	}
	if first, dup := shard.add(42, "alpha", 9); !dup || first != 6 {
		t.Fatalf("alpha again: first=%d dup=%v, want 6 true", first, dup)
	}
	s := newIDSet()
	// Many ids across several arena chunks, including one larger than a chunk.
	big := strings.Repeat("z", idChunkSize+10)
	for i := range 20000 {
		id := fmt.Sprintf("id-%06d-%s", i, strings.Repeat("p", i%50))
		if i == 7 {
			id = big
		}
		if _, dup := s.add(id, 100+i); dup {
			t.Fatalf("id %d reported as duplicate", i)
		}
	}
	if first, dup := s.add(big, 1); !dup || first != 107 {
		t.Fatalf("big id: first=%d dup=%v", first, dup)
	}
	if first, dup := s.add("id-019999-"+strings.Repeat("p", 19999%50), 1); !dup || first != 100+19999 {
		t.Fatalf("last id: first=%d dup=%v", first, dup)
	}
	for k, shard := range s.shards {
		if len(shard.chunks) < 2 {
			t.Errorf("shard %d has %d arena chunks: the ids should spread over every shard, and fill more than a chunk of each", k, len(shard.chunks))
		}
	}
}

func TestReaderLineEnds(t *testing.T) {
	t.Parallel()
	in := "\xef\xbb\xbf" + goodA + "\r\n\r\n   \t\r\n" + `{"custom_id":"c","model":"m","prompt":"a\r\nb"}` + "\r\n\n" + goodB // no final newline
	items, err := readString(t, in, Limits{})
	mustEOF(t, err)
	if len(items) != 3 {
		t.Fatalf("got %d outcomes: %+v", len(items), items)
	}
	for i, want := range []struct {
		id   string
		line int
	}{{"good-a", 1}, {"c", 4}, {"good-b", 6}} {
		if items[i].lerr != nil || items[i].job.CustomID != want.id || items[i].line != want.line {
			t.Errorf("outcome %d = %+v, want %s on line %d", i, items[i], want.id, want.line)
		}
	}
	if items[1].job.Prompt != "a\r\nb" {
		t.Errorf("escaped CRLF inside a string changed: %q", items[1].job.Prompt)
	}

	// Files written on Windows and joined with cat: each one's byte order mark begins a line.
	items, err = readString(t, "\xef\xbb\xbf"+goodA+"\r\n\xef\xbb\xbf"+goodB+"\r\n", Limits{})
	mustEOF(t, err)
	if len(items) != 2 || items[0].lerr != nil || items[1].lerr != nil || items[1].job.CustomID != "good-b" {
		t.Fatalf("joined files with byte order marks: %+v", items)
	}
}

// TestReaderRawIsTheLineAsRead: Raw gives a valid line's bytes without its line end, the
// spaces around it and a byte order mark, so that it can be written out again unchanged.
func TestReaderRawIsTheLineAsRead(t *testing.T) {
	t.Parallel()
	spaced := `{"custom_id":"c", "model":"m",  "prompt":"a\r\nb"}`
	r := NewReader(strings.NewReader("\xef\xbb\xbf"+goodA+"\r\n{\n  "+spaced+"\t\r\n"), "in.jsonl", Limits{})
	var raws []string
	for {
		_, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err == nil {
			raws = append(raws, string(r.Raw()))
		}
	}
	if len(raws) != 2 || raws[0] != goodA || raws[1] != spaced {
		t.Errorf("raw lines %q; want %q and %q", raws, goodA, spaced)
	}
}

func TestReaderEmptyFile(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", "\n", "\r\n  \n\t\n", "\xef\xbb\xbf"} {
		r := NewReader(strings.NewReader(in), "empty.jsonl", Limits{})
		_, err := r.Next()
		if !errors.Is(err, ErrEmptyFile) || !strings.Contains(err.Error(), "empty.jsonl") {
			t.Errorf("%q: err = %v, want ErrEmptyFile naming the file", in, err)
		}
		var le *LineError
		if errors.As(err, &le) {
			t.Errorf("%q: ErrEmptyFile must not be a *LineError (callers skip those and go on)", in)
		}
		if _, err := r.Next(); !errors.Is(err, io.EOF) {
			t.Errorf("%q: second Next = %v, want io.EOF", in, err)
		}
	}
	// A file of bad lines is not empty.
	items, err := readString(t, "{\n", Limits{})
	mustEOF(t, err)
	if len(items) != 1 || items[0].lerr == nil {
		t.Fatalf("got %+v", items)
	}
}

func TestReaderReadError(t *testing.T) {
	t.Parallel()
	boom := errors.New("disk on fire")
	r := NewReader(io.MultiReader(strings.NewReader(goodA+"\n"), iotest.ErrReader(boom)), "f.jsonl", Limits{})
	if j, err := r.Next(); err != nil || j.CustomID != "good-a" {
		t.Fatalf("first Next = %v, %v", j.CustomID, err)
	}
	for range 2 {
		_, err := r.Next()
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "f.jsonl") {
			t.Fatalf("Next = %v, want the read error, wrapped with the file name", err)
		}
	}
}

func TestReaderOversizeLines(t *testing.T) {
	t.Parallel()
	// A valid line of exactly 64 bytes.
	exact := `{"custom_id":"e","model":"m","prompt":"` + strings.Repeat("a", 64-41) + `"}`
	if len(exact) != 64 {
		t.Fatalf("test line is %d bytes", len(exact))
	}
	over := `{"custom_id":"o","model":"m","prompt":"` + strings.Repeat("a", 64-40) + `"}`
	huge := strings.Repeat("h", 1000)
	l := Limits{MaxLineBytes: 64}
	in := exact + "\r\n" + over + "\n" + huge + "\n" + `{"custom_id":"s","model":"m","prompt":"s"}` + "\n" + huge
	items, err := readString(t, in, l)
	mustEOF(t, err)
	want := []string{"e", "!2", "!3", "s", "!5"}
	if len(items) != len(want) {
		t.Fatalf("got %d outcomes, want %d: %+v", len(items), len(want), items)
	}
	for i, w := range want {
		if w[0] == '!' {
			le := items[i].lerr
			if le == nil || fmt.Sprint(le.Line) != w[1:] || !strings.Contains(le.Msg, "longer than the limit of 64 bytes") {
				t.Errorf("outcome %d = %+v, want oversize error on line %s", i, items[i], w[1:])
			}
			continue
		}
		if items[i].lerr != nil || items[i].job.CustomID != w {
			t.Errorf("outcome %d = %+v, want job %q", i, items[i], w)
		}
	}
}

// endlessLine is a reader producing one line of n bytes, then a newline and a good line.
type endlessLine struct {
	n    int
	tail *strings.Reader
}

func (e *endlessLine) Read(p []byte) (int, error) {
	if e.n > 0 {
		k := min(len(p), e.n)
		for i := range k {
			p[i] = 'x'
		}
		e.n -= k
		return k, nil
	}
	return e.tail.Read(p)
}

// TestReaderOversizeLineNotBuffered reads a 64 MiB line through a 64 KiB limit and checks that
// the reader allocated about its buffer, not the line.
func TestReaderOversizeLineNotBuffered(t *testing.T) {
	src := &endlessLine{n: 64 << 20, tail: strings.NewReader("\n" + goodA + "\n")}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r := NewReader(src, "big.jsonl", Limits{MaxLineBytes: 64 << 10})
	_, err := r.Next()
	var le *LineError
	if !errors.As(err, &le) || le.Line != 1 {
		t.Fatalf("first Next = %v, want an oversize LineError", err)
	}
	j, err := r.Next()
	if err != nil || j.CustomID != "good-a" {
		t.Fatalf("second Next = %v, %v", j.CustomID, err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("reading a 64 MiB line allocated %d bytes; it must be skipped, not buffered", grew)
	}
}

func TestReaderStreamsManyLines(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	const n = 20000
	for i := range n {
		buf.WriteString(genLine(i))
		buf.WriteByte('\n')
	}
	items, err := readAll(t, NewReader(&buf, "gen.jsonl", Limits{}))
	mustEOF(t, err)
	if len(items) != n {
		t.Fatalf("got %d outcomes, want %d", len(items), n)
	}
	for i, it := range items {
		if it.lerr != nil {
			t.Fatalf("line %d: %v", i+1, it.lerr)
		}
	}
}

func TestNextFileFindsDuplicatesAcrossInputs(t *testing.T) {
	t.Parallel()
	line := func(id string) string {
		return `{"custom_id":"` + id + `","model":"Qwen/Qwen3-8B","prompt":"hi"}` + "\n"
	}
	r := NewReader(strings.NewReader(line("a")+line("b")), "one.jsonl", Limits{})
	for range 2 {
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("end of first file: %v", err)
	}
	r.NextFile(strings.NewReader(line("c")+line("b")), "two.jsonl")
	if j, err := r.Next(); err != nil || j.CustomID != "c" {
		t.Fatalf("first line of second file: %v %v", j.CustomID, err)
	}
	_, err := r.Next()
	var le *LineError
	if !errors.As(err, &le) || le.File != "two.jsonl" || le.Line != 2 || le.Field != "custom_id" ||
		!strings.Contains(le.Msg, "one.jsonl line 2") {
		t.Fatalf("duplicate across files: %v", err)
	}
}

// TestPromptLimitCountsCharactersNotBytes: a prompt (or messages' content) at the limit in
// characters is accepted however many bytes its characters take.
func TestPromptLimitCountsCharactersNotBytes(t *testing.T) {
	limits := Limits{MaxPromptChars: 5}
	for _, line := range []string{
		`{"custom_id":"x","model":"m","prompt":"ééééé"}`,
		`{"custom_id":"x","model":"m","messages":[{"role":"user","content":"éé"},{"role":"user","content":"ééé"}]}`,
	} {
		items, err := readString(t, line+"\n", limits)
		mustEOF(t, err)
		if len(items) != 1 || items[0].lerr != nil {
			t.Errorf("%s: %+v, want it accepted (5 characters in 10 bytes, limit 5)", line, items)
		}
	}
}

// TestReaderTakesLinesLongerThanItsBuffer: lines longer than the read buffer are gathered
// whole, up to the line limit. The default limit takes a prompt at the prompt limit written
// as Python's json.dumps writes CJK text (a 6-byte \uXXXX per character); a line over the
// limit is refused, and the lines after it, the last without a line end, still read.
func TestReaderTakesLinesLongerThanItsBuffer(t *testing.T) {
	t.Parallel()
	escaped := `{"custom_id":"cjk","model":"m","prompt":"` + strings.Repeat(`\u4e2d`, DefaultMaxPromptChars) + `"}`
	over := `{"custom_id":"over","model":"m","prompt":"` + strings.Repeat("a", DefaultMaxLineBytes) + `"}`
	last := `{"custom_id":"last","model":"m","prompt":"` + strings.Repeat("b", 3*readBuffer) + `"}`
	items, err := readString(t, escaped+"\n"+over+"\r\n"+goodA+"\n"+last, Limits{})
	mustEOF(t, err)
	if len(items) != 4 {
		t.Fatalf("got %d outcomes, want 4: %+v", len(items), items)
	}
	if j := items[0].job; items[0].lerr != nil || j.CustomID != "cjk" || j.Prompt != strings.Repeat("中", DefaultMaxPromptChars) {
		t.Errorf("line 1 (%d bytes): %v, custom_id %q, prompt of %d bytes", len(escaped), items[0].lerr, j.CustomID, len(j.Prompt))
	}
	if le := items[1].lerr; le == nil || le.Line != 2 || !strings.Contains(le.Msg, "longer than the limit") {
		t.Errorf("line 2, over the limit: %+v", items[1])
	}
	if items[2].lerr != nil || items[2].job.CustomID != "good-a" {
		t.Errorf("line 3: %+v", items[2])
	}
	if j := items[3].job; items[3].lerr != nil || j.CustomID != "last" || len(j.Prompt) != 3*readBuffer {
		t.Errorf("line 4: %v, custom_id %q, prompt of %d bytes", items[3].lerr, j.CustomID, len(j.Prompt))
	}
}

// TestAnUnknownFieldIsNamedWhateverItsName: an unknown key that is empty, holds a line
// break or a terminal escape, or a '.' is named quoted, so that the error still names a field
// (a field "" would read as a problem of the whole line, in the rejects file too), stays on
// one line of stderr, writes no control character to the terminal, and reads as one key
// rather than a path.
func TestAnUnknownFieldIsNamedWhateverItsName(t *testing.T) {
	t.Parallel()
	const (
		native = `{"custom_id":"x","model":"m","prompt":"p",`
		chat   = `{"custom_id":"x","url":"/v1/chat/completions","body":{"model":"m",`
	)
	tests := []struct{ line, field string }{
		{native + `"":1}`, `""`},
		{native + `"a\nb":1}`, `"a\nb"`},
		{native + `"\u001b[2J":1}`, `"\x1b[2J"`},
		{native + `"sampling_params.max_tokens":1}`, `"sampling_params.max_tokens"`},
		{native + `"sampling_params":{"":1}}`, `sampling_params.""`},
		{native[:len(native)-len(`"prompt":"p",`)] + `"messages":[{"role":"user","content":"c","\r":1}]}`, `messages[0]."\r"`},
		{`{"":1,"custom_id":"x","url":"/v1/completions","body":{}}`, `""`},
		{chat + `"messages":[{"role":"user","content":"c"}],"":1}}`, `body.""`},
		{chat + `"messages":[{"role":"user","content":"c"}],"\n":null,"\n":null}}`, `body."\n"`},
		{chat + `"messages":[{"role":"user","content":[{"type":"text","text":"c","":1}]}]}}`, `body.messages[0].content[0].""`},
		{chat + `"messages":[{"role":"user","content":"c"}],"chat_template_kwargs":{"\t":true}}}`, `body.chat_template_kwargs."\t"`},
		{native + `"colour":1}`, `colour`},
	}
	for _, tt := range tests {
		items, err := readString(t, tt.line, Limits{})
		mustEOF(t, err)
		if len(items) != 1 || items[0].lerr == nil {
			t.Fatalf("%s: want one line error, got %+v", tt.line, items)
		}
		if le := items[0].lerr; le.Field != tt.field {
			t.Errorf("%s: field %q, want %q (%s)", tt.line, le.Field, tt.field, le.Error())
		} else if strings.ContainsFunc(le.Error(), unicode.IsControl) {
			t.Errorf("%s: the error holds a control character: %q", tt.line, le.Error())
		}
	}
}

// TestAWholeNumberWrittenWithAPointIsReadExactly: an integer field written as a whole number
// with a decimal point (9007199254740993.0, as some writers print every number) is that
// integer exactly; read through a float64 it lost its last digits, and the largest seed,
// 9223372036854775807.0, rounded past the range and was refused.
func TestAWholeNumberWrittenWithAPointIsReadExactly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		seed string
		want int64
	}{
		{"9007199254740993.0", 9007199254740993},
		{"9223372036854775807.000", math.MaxInt64},
		{"-9223372036854775808.0", math.MinInt64},
		{"256.0", 256},
		{"1e3", 1000},
	} {
		items, err := readString(t, `{"custom_id":"x","model":"m","prompt":"p","sampling_params":{"seed":`+c.seed+`}}`, Limits{})
		mustEOF(t, err)
		if len(items) != 1 || items[0].lerr != nil {
			t.Fatalf("seed %s: %+v", c.seed, items)
		}
		if got := items[0].job.Params.Seed; got == nil || *got != c.want {
			t.Errorf("seed %s read as %s, want %d", c.seed, fmtPtr(got), c.want)
		}
	}
}

// fmtPtr prints the value p points to, or nil.
func fmtPtr(p *int64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatInt(*p, 10)
}

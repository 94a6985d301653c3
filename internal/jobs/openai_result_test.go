package jobs

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"
)

// openAILine is the per-line object of OpenAI's batch output and error files, as documented
// (BatchRequestOutput): id, custom_id, response {status_code, request_id, body} or null, error
// {code, message} or null.
type openAILine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// openAIUsage is the usage object of OpenAI's completions (CompletionUsage).
type openAIUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// chatCompletion is OpenAI's chat completion object, with the fields AppendOpenAI writes.
type chatCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
			Refusal *string `json:"refusal"`
		} `json:"message"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason string          `json:"finish_reason"`
	} `json:"choices"`
	Usage openAIUsage `json:"usage"`
}

// textCompletion is OpenAI's (legacy) completion object.
type textCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Text         string          `json:"text"`
		Index        int             `json:"index"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason string          `json:"finish_reason"`
	} `json:"choices"`
	Usage openAIUsage `json:"usage"`
}

// openAIErrorBody is OpenAI's error response body.
type openAIErrorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// strictDecode decodes data into v, failing on any field v does not have.
func strictDecode(t *testing.T, data []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
}

// appendOpenAI encodes r and checks what every line must be: one line of valid JSON holding
// exactly id, custom_id, response and error, whose response and error are not both set.
func appendOpenAI(t *testing.T, r Result, created time.Time) ([]byte, openAILine) {
	t.Helper()
	b, err := r.AppendOpenAI(nil, created)
	if err != nil {
		t.Fatalf("AppendOpenAI(%+v): %v", r, err)
	}
	if bytes.ContainsAny(b, "\n\r") || !json.Valid(b) {
		t.Fatalf("not one line of JSON: %q", b)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil || len(keys) != 4 {
		t.Fatalf("top-level keys of %s: %v (%v)", b, keys, err)
	}
	var line openAILine
	strictDecode(t, b, &line)
	if (line.Response == nil) == (line.Error == nil) {
		t.Fatalf("exactly one of response and error must be set: %s", b)
	}
	return b, line
}

var created = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func TestAppendOpenAIChatOK(t *testing.T) {
	t.Parallel()
	r := Result{CustomID: "request-1", BatchID: "b-1", Status: StatusOK, Model: "Qwen/Qwen3-8B", Format: FormatOpenAIChat,
		Samples:  []Sample{{Text: "Hello!", Tokens: []int{9707, 0, 151645}, Logprobs: Logprobs{-0.1, -0.2, -0.3}, StopReason: StopReasonStop}},
		Usage:    &Usage{PromptTokens: 22, CompletionTokens: 3, CacheHitTokens: 16},
		Attempts: 1, LatencyMS: 12, Metadata: json.RawMessage(`{"run":"42"}`)}
	b, line := appendOpenAI(t, r, created)
	h := openAIHash("b-1", "request-1")
	want := `{"id":"batch_req_` + string(h[:]) + `","custom_id":"request-1","response":{"status_code":200,"request_id":"req_` + string(h[:]) + `",` +
		`"body":{"id":"chatcmpl-` + string(h[:]) + `","object":"chat.completion","created":1748779200,"model":"Qwen/Qwen3-8B",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello!","refusal":null},"logprobs":null,"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":22,"completion_tokens":3,"total_tokens":25,"prompt_tokens_details":{"cached_tokens":16}}}},"error":null}`
	if string(b) != want {
		t.Fatalf("\n got %s\nwant %s", b, want)
	}
	if line.Response.StatusCode != 200 || line.CustomID != "request-1" {
		t.Fatalf("line %+v", line)
	}
	var c chatCompletion
	strictDecode(t, line.Response.Body, &c)
	if c.Object != "chat.completion" || c.Created != created.Unix() || c.Model != "Qwen/Qwen3-8B" || len(c.Choices) != 1 ||
		c.Choices[0].Message.Role != "assistant" || c.Choices[0].Message.Content == nil || *c.Choices[0].Message.Content != "Hello!" ||
		c.Choices[0].Message.Refusal != nil || string(c.Choices[0].Logprobs) != "null" || c.Choices[0].FinishReason != "stop" ||
		c.Usage.TotalTokens != 25 || c.Usage.PromptTokensDetails.CachedTokens != 16 {
		t.Fatalf("chat completion %+v", c)
	}
	// Appending keeps what the buffer held.
	if got, err := r.AppendOpenAI([]byte("prefix:"), created); err != nil || string(got) != "prefix:"+want {
		t.Fatalf("AppendOpenAI onto a prefix: %q, %v", got, err)
	}
}

// TestAppendOpenAILogprobs: a job that asked for logprobs gets OpenAI's shapes, one entry per
// sampled token (the stop token included): a token that is a part of a character as
// "bytes:\xNN" with its raw bytes, -inf and a missing logprob as -9999.0, a completion's
// top_logprobs the sampled token alone and its text_offset in characters; without a
// tokenizer's bytes, vLLM's "token_id:<id>". One that did not ask keeps "logprobs": null.
func TestAppendOpenAILogprobs(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	body := func(r Result) string {
		t.Helper()
		_, line := appendOpenAI(t, r, created)
		var c struct {
			Choices []struct {
				Logprobs json.RawMessage `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(line.Response.Body, &c); err != nil || len(c.Choices) == 0 {
			t.Fatalf("body %s: %v", line.Response.Body, err)
		}
		var all []string
		for _, ch := range c.Choices {
			all = append(all, string(ch.Logprobs))
		}
		return strings.Join(all, "\n")
	}
	chat := Result{CustomID: "c", BatchID: "b", Status: StatusOK, Model: "Qwen/Qwen3-8B", Format: FormatOpenAIChat,
		OpenAILogprobs: true, Usage: &Usage{PromptTokens: 3, CompletionTokens: 5},
		Samples: []Sample{{Text: "H\u00e9 \U0001F642", Tokens: []int{39, 2, 3, 4, 151645}, Logprobs: Logprobs{-0.5, math.Inf(-1), nan, -1e5, 0},
			TokenBytes: TokenBytes{[]byte("H"), {0xc3}, {0xa9, ' ', 0xf0, 0x9f}, {0x99, 0x82}, []byte("<|im_end|>")}, StopReason: StopReasonStop}}}
	want := `{"content":[{"token":"H","logprob":-0.5,"bytes":[72],"top_logprobs":[]},` +
		`{"token":"bytes:\\xc3","logprob":-9999.0,"bytes":[195],"top_logprobs":[]},` +
		`{"token":"bytes:\\xa9 \\xf0\\x9f","logprob":-9999.0,"bytes":[169,32,240,159],"top_logprobs":[]},` +
		`{"token":"bytes:\\x99\\x82","logprob":-9999.0,"bytes":[153,130],"top_logprobs":[]},` +
		`{"token":"<|im_end|>","logprob":0,"bytes":[60,124,105,109,95,101,110,100,124,62],"top_logprobs":[]}],"refusal":null}`
	if got := body(chat); got != want {
		t.Errorf("chat logprobs\n got %s\nwant %s", got, want)
	}

	cmpl := Result{CustomID: "p", BatchID: "b", Status: StatusOK, Model: "Qwen/Qwen3-8B", Format: FormatOpenAICompletions,
		OpenAILogprobs: true, Usage: &Usage{PromptTokens: 3, CompletionTokens: 6},
		Samples: []Sample{
			{Text: "H\u00e9\"!", Tokens: []int{39, 2, 3, 1, 0}, Logprobs: Logprobs{-0.5, -1, nan, -0.25, -2},
				TokenBytes: TokenBytes{[]byte("H"), {0xc3}, {0xa9}, []byte(`"`), []byte("!")}, StopReason: StopReasonLength},
			{Text: "", Tokens: []int{5}, Logprobs: Logprobs{-3}, StopReason: StopReasonLength}, // no tokenizer: no bytes
		}}
	want = `{"tokens":["H","bytes:\\xc3","bytes:\\xa9","\"","!"],"token_logprobs":[-0.5,-1,-9999.0,-0.25,-2],` +
		`"top_logprobs":[{"H":-0.5},{"bytes:\\xc3":-1},{"bytes:\\xa9":-9999.0},{"\"":-0.25},{"!":-2}],"text_offset":[0,1,1,2,3]}` + "\n" +
		`{"tokens":["token_id:5"],"token_logprobs":[-3],"top_logprobs":[{"token_id:5":-3}],"text_offset":[0]}`
	if got := body(cmpl); got != want {
		t.Errorf("completion logprobs\n got %s\nwant %s", got, want)
	}

	// Chat bytes null without a tokenizer; and no logprobs at all without the request.
	chat.Samples[0].TokenBytes = nil
	if got := body(chat); !strings.Contains(got, `{"token":"token_id:39","logprob":-0.5,"bytes":null,"top_logprobs":[]}`) {
		t.Errorf("chat logprobs without token bytes: %s", got)
	}
	chat.OpenAILogprobs, cmpl.OpenAILogprobs = false, false
	if got := body(chat) + "\n" + body(cmpl); got != "null\nnull\nnull" {
		t.Errorf("logprobs not asked for: %s", got)
	}
}

// TestAppendOpenAITextOffsetAfterABrokenCharacter: a token that begins a character the next
// token does not end leaves a U+FFFD in the text (one per maximal subpart, as the worker's
// Decode writes it), and text_offset counts that U+FFFD, not each of its bytes, nor none
// of them before the token that broke it.
func TestAppendOpenAITextOffsetAfterABrokenCharacter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tb   TokenBytes
		text string
		want string
	}{
		{TokenBytes{{0xe4, 0xbd}, []byte(" A"), []byte("B")}, "\ufffd AB", "[0,1,3]"},
		{TokenBytes{{0xe4}, {0xbd}, []byte("A")}, "\ufffdA", "[0,0,1]"},
		{TokenBytes{{0xf0, 0x9f}, []byte("A"), {0x99, 0x82}, []byte("B")}, "\ufffdA\ufffd\ufffdB", "[0,1,2,4]"},
		{TokenBytes{{0xe0}, {0x80, 'A'}, {0xe4, 0xbd}, {0xa0}, []byte("B")}, "\ufffd\ufffdA你B", "[0,1,3,3,4]"},
		{TokenBytes{[]byte("H"), {0xc3}, {0xa9}, []byte("!")}, "Hé!", "[0,1,1,2]"},
	} {
		tokens := make([]int, len(c.tb))
		r := Result{CustomID: "p", BatchID: "b", Status: StatusOK, Model: "Qwen/Qwen3-8B", Format: FormatOpenAICompletions,
			OpenAILogprobs: true, Usage: &Usage{PromptTokens: 1, CompletionTokens: len(tokens)},
			Samples: []Sample{{Text: c.text, Tokens: tokens, TokenBytes: c.tb, StopReason: StopReasonLength}}}
		_, line := appendOpenAI(t, r, created)
		var body struct {
			Choices []struct {
				Logprobs struct {
					TextOffset json.RawMessage `json:"text_offset"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(line.Response.Body, &body); err != nil || len(body.Choices) != 1 {
			t.Fatalf("body %s: %v", line.Response.Body, err)
		}
		if got := string(body.Choices[0].Logprobs.TextOffset); got != c.want {
			t.Errorf("tokens %q (text %q): text_offset %s, want %s", c.tb, c.text, got, c.want)
		}
	}
}

// TestAppendOpenAISplitsReasoning: a gpt-oss chat sample's final channel is the content and
// its other channels the reasoning_content, as vLLM answers; a thinking Qwen3's or DeepSeek
// V3.1's answer and thought are split at </think>; other samples are left whole.
func TestAppendOpenAISplitsReasoning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text, content string
		reasoning     *string
		model         string // "" is openai/gpt-oss-20b
	}{
		{text: "<think>\n2+2 is 4.\n</think>\n\nFour.", content: "Four.", reasoning: ptr("2+2 is 4."), model: "Qwen/Qwen3-8B"},
		{text: "<think>\nStill thinking when max_tok", content: "", reasoning: ptr("Still thinking when max_tok"), model: "Qwen/Qwen3-8B"},
		{text: "Fine </think> here", content: "Fine </think> here", model: "Qwen/Qwen3-8B"},
		{text: "2+2 is 4.</think>Four.", content: "Four.", reasoning: ptr("2+2 is 4."), model: "deepseek-ai/DeepSeek-V3.1"},
		{text: "Four.", content: "Four.", model: "deepseek-ai/DeepSeek-V3.1"},
		{text: "<|channel|>analysis<|message|>221 = 13 x 17.<|end|><|start|>assistant<|channel|>final<|message|>No.", content: "No.", reasoning: ptr("221 = 13 x 17.")},
		{text: "<|channel|>final<|message|>Hi", content: "Hi", reasoning: ptr("")},
		{text: "<|channel|>analysis<|message|>Cut off by max_tok", content: "", reasoning: ptr("Cut off by max_tok")},
		{text: "<|channel|>analy", content: "", reasoning: ptr("")},
		{text: "<|channel|>analysis<|message|>a<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}",
			content: "", reasoning: ptr("a\n\n{}")},
		{text: "Hello <|channel|>", content: "Hello <|channel|>"},
	} {
		model := tc.model
		if model == "" {
			model = "openai/gpt-oss-20b"
		}
		r := Result{CustomID: "c", BatchID: "b", Status: StatusOK, Model: model, Format: FormatOpenAIChat,
			Samples: []Sample{{Text: tc.text, Tokens: []int{1}, Logprobs: Logprobs{-1}, StopReason: StopReasonStop}},
			Usage:   &Usage{PromptTokens: 1, CompletionTokens: 1}}
		_, line := appendOpenAI(t, r, created)
		var c struct {
			Choices []struct {
				Message map[string]*string `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(line.Response.Body, &c); err != nil {
			t.Fatal(err)
		}
		m := c.Choices[0].Message
		reasoning, has := m["reasoning_content"]
		switch {
		case m["content"] == nil || *m["content"] != tc.content:
			t.Errorf("%q: content %v, want %q", tc.text, m["content"], tc.content)
		case tc.reasoning == nil && has:
			t.Errorf("%q: reasoning_content %q, want none", tc.text, *reasoning)
		case tc.reasoning != nil && (reasoning == nil || *reasoning != *tc.reasoning):
			t.Errorf("%q: reasoning_content %v, want %q", tc.text, reasoning, *tc.reasoning)
		}
	}
}

func ptr(s string) *string { return &s }

func TestAppendOpenAICompletionsTwoSamples(t *testing.T) {
	t.Parallel()
	r := Result{CustomID: "request-3", BatchID: "b-1", Status: StatusOK, Model: "tinker://x:train:0/sampler_weights/s", Format: FormatOpenAICompletions,
		Samples: []Sample{
			{Text: " This is a test.", Tokens: []int{1, 2, 3, 4, 5}, StopReason: StopReasonStop},
			{Text: " This is", Tokens: []int{1, 2}, StopReason: StopReasonLength},
		},
		Usage: &Usage{PromptTokens: 5, CompletionTokens: 7}}
	_, line := appendOpenAI(t, r, created)
	var c textCompletion
	strictDecode(t, line.Response.Body, &c)
	h := openAIHash("b-1", "request-3")
	if c.ID != "cmpl-"+string(h[:]) || c.Object != "text_completion" || c.Created != created.Unix() || c.Model != r.Model || len(c.Choices) != 2 {
		t.Fatalf("completion %+v", c)
	}
	for i, want := range []struct{ text, finish string }{{" This is a test.", "stop"}, {" This is", "length"}} {
		ch := c.Choices[i]
		if ch.Index != i || ch.Text != want.text || ch.FinishReason != want.finish || string(ch.Logprobs) != "null" {
			t.Errorf("choice %d: %+v", i, ch)
		}
	}
	if c.Usage.PromptTokens != 5 || c.Usage.CompletionTokens != 7 || c.Usage.TotalTokens != 12 {
		t.Errorf("usage %+v", c.Usage)
	}
}

// TestAppendOpenAINativeIsATextCompletion: a native result forced into the OpenAI format
// becomes a text_completion (the result does not say whether the job had messages).
func TestAppendOpenAINativeIsATextCompletion(t *testing.T) {
	t.Parallel()
	r := Result{CustomID: "n", BatchID: "b", Status: StatusOK, Model: "m",
		Samples: []Sample{{Text: "x", Tokens: []int{1}, StopReason: StopReasonStop}}}
	_, line := appendOpenAI(t, r, time.Time{})
	var c textCompletion
	strictDecode(t, line.Response.Body, &c)
	if c.Object != "text_completion" || c.Created != 0 || c.Choices[0].Text != "x" || c.Usage.TotalTokens != 0 {
		t.Fatalf("completion %+v", c)
	}
}

func TestAppendOpenAIErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		code     string
		category Category
		status   int
		typ      string
	}{
		{CodeInvalidJob, CategoryUser, 400, "invalid_request_error"},
		{CodeContextTooLong, CategoryUser, 400, "invalid_request_error"},
		{CodeTokenize, CategoryUser, 400, "invalid_request_error"},
		{CodeAPIError, CategoryUser, 400, "invalid_request_error"},
		{CodeFailedFuture, CategoryUser, 400, "invalid_request_error"},
		{CodeInternal, CategoryUser, 400, "invalid_request_error"}, // a result too large to store
		{CodeRateLimited, CategoryServer, 429, "requests"},
		{CodeRateLimited, CategoryUser, 429, "requests"},
		{CodeDeadLetter, CategoryServer, 500, "server_error"},
		{CodeInternal, CategoryServer, 500, "server_error"},
		{CodeTimeout, CategoryServer, 500, "server_error"},
		{CodeFailedFuture, CategoryUnknown, 500, "server_error"},
	} {
		for _, format := range []string{FormatOpenAIChat, FormatOpenAICompletions, ""} {
			r := Result{CustomID: "e-" + tt.code, BatchID: "b", Status: StatusError, Model: "m", Format: format,
				Error: &ResultError{Code: tt.code, Message: "it failed: " + tt.code, Category: tt.category}}
			_, line := appendOpenAI(t, r, created)
			if line.Error != nil || line.Response.StatusCode != tt.status {
				t.Errorf("%s/%s (%s): %+v", tt.code, tt.category, format, line)
				continue
			}
			h := openAIHash("b", r.CustomID)
			if line.Response.RequestID != "req_"+string(h[:]) {
				t.Errorf("request id %q", line.Response.RequestID)
			}
			var body openAIErrorBody
			strictDecode(t, line.Response.Body, &body)
			if body.Error.Type != tt.typ || body.Error.Code != tt.code || body.Error.Message != "it failed: "+tt.code || body.Error.Param != nil {
				t.Errorf("%s/%s (%s): body %+v", tt.code, tt.category, format, body)
			}
		}
	}
}

func TestAppendOpenAICancelled(t *testing.T) {
	t.Parallel()
	r := CancelledResult(Job{CustomID: "request-2", Model: "m", Format: FormatOpenAIChat}, "b", "batch cancelled by user")
	if r.Format != FormatOpenAIChat {
		t.Fatalf("CancelledResult format %q", r.Format)
	}
	b, line := appendOpenAI(t, r, created)
	if !strings.Contains(string(b), `"response":null`) || line.Error.Code != "batch_cancelled" ||
		line.Error.Message != "batch cancelled by user" {
		t.Fatalf("cancelled line %s", b)
	}
}

func TestAppendOpenAIEscapesText(t *testing.T) {
	t.Parallel()
	text := "say \"hi\"\\\n\t<|im_end|>&\x00\u2028é漢🙂\xff"
	for _, format := range []string{FormatOpenAIChat, FormatOpenAICompletions} {
		r := Result{CustomID: "q\"uote\n\xfe", BatchID: "b", Status: StatusOK, Model: "m<&>\"", Format: format,
			Samples: []Sample{{Text: text, Tokens: []int{1}, StopReason: StopReasonStop}}}
		b, line := appendOpenAI(t, r, created)
		// encoding/json decodes what appendJSONString wrote, invalid UTF-8 as U+FFFD.
		wantText := strings.ToValidUTF8(text, "\uFFFD")
		if line.CustomID != strings.ToValidUTF8(r.CustomID, "\uFFFD") {
			t.Errorf("custom_id %q", line.CustomID)
		}
		var got string
		if format == FormatOpenAIChat {
			var c chatCompletion
			strictDecode(t, line.Response.Body, &c)
			got = *c.Choices[0].Message.Content
			if c.Model != r.Model {
				t.Errorf("model %q", c.Model)
			}
		} else {
			var c textCompletion
			strictDecode(t, line.Response.Body, &c)
			got = c.Choices[0].Text
		}
		if got != wantText {
			t.Errorf("%s: text %q, want %q", format, got, wantText)
		}
		if !bytes.Contains(b, []byte(`<|im_end|>&`)) || !bytes.Contains(b, []byte(`\u2028`)) {
			t.Errorf("%s: not escaped as result lines are: %s", format, b)
		}
	}
	// Error messages are escaped the same way.
	r := Result{CustomID: "e", BatchID: "b", Status: StatusError, Format: FormatOpenAIChat,
		Error: &ResultError{Code: CodeAPIError, Message: "bad \"x\"\n\x01", Category: CategoryUser}}
	_, line := appendOpenAI(t, r, created)
	var body openAIErrorBody
	strictDecode(t, line.Response.Body, &body)
	if body.Error.Message != r.Error.Message {
		t.Errorf("message %q", body.Error.Message)
	}
}

func TestAppendOpenAIIDsAreDeterministic(t *testing.T) {
	t.Parallel()
	idRe := regexp.MustCompile(`^batch_req_[0-9a-f]{24}$`)
	line := func(batch, id string) openAILine {
		r := Result{CustomID: id, BatchID: batch, Status: StatusOK, Format: FormatOpenAIChat,
			Samples: []Sample{{Text: "t", Tokens: []int{1}, StopReason: StopReasonStop}}}
		a, la := appendOpenAI(t, r, created)
		b, _ := appendOpenAI(t, r, created)
		if !bytes.Equal(a, b) {
			t.Fatalf("two encodings differ:\n%s\n%s", a, b)
		}
		if !idRe.MatchString(la.ID) || la.Response.RequestID != "req_"+strings.TrimPrefix(la.ID, "batch_req_") {
			t.Fatalf("ids %q %q", la.ID, la.Response.RequestID)
		}
		var c chatCompletion
		strictDecode(t, la.Response.Body, &c)
		if c.ID != "chatcmpl-"+strings.TrimPrefix(la.ID, "batch_req_") {
			t.Fatalf("completion id %q for %q", c.ID, la.ID)
		}
		return la
	}
	// Batch ids hold no "/" (queue.ValidateBatchID), so batch + "/" + custom_id is unambiguous.
	seen := map[string][2]string{}
	for _, k := range [][2]string{{"b-1", "a"}, {"b-1", "b"}, {"b-2", "a"}, {"b-1", "a/"}, {"b-1", "/a"}, {"b", "1/a"}} {
		id := line(k[0], k[1]).ID
		if prev, dup := seen[id]; dup {
			t.Errorf("%v and %v share the id %s", k, prev, id)
		}
		seen[id] = k
	}
}

func TestAppendOpenAIRejectsInvalidResults(t *testing.T) {
	t.Parallel()
	for _, r := range []Result{
		{CustomID: "", BatchID: "b", Status: StatusOK},
		{CustomID: "x", BatchID: "b", Status: StatusError},
		{CustomID: "x", BatchID: "b", Status: "done"},
		{CustomID: "x", BatchID: "b", Status: StatusOK, Format: "csv"},
		{CustomID: "x", BatchID: "b", Status: StatusOK, Samples: []Sample{{StopReason: "eos"}}},
	} {
		b, err := r.AppendOpenAI([]byte("keep"), created)
		var fe *FieldError
		if !errors.As(err, &fe) || b != nil {
			t.Errorf("AppendOpenAI(%+v) = %q, %v; want a field error", r, b, err)
		}
	}
}

func TestResultFormat(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		FormatOpenAIChat: FormatOpenAIChat, FormatOpenAICompletions: FormatOpenAICompletions,
		FormatNative: "", "": "", "csv": "",
	} {
		if got := ResultFormat(in); got != want {
			t.Errorf("ResultFormat(%q) = %q, want %q", in, got, want)
		}
		if got := NewResult(Job{CustomID: "x", Format: in}, "b").Format; got != want {
			t.Errorf("NewResult of a %q job: format %q, want %q", in, got, want)
		}
	}
	line := `{"custom_id":"x","batch_id":"b","status":"ok","model":"m","format":"openai-completions","attempts":0,"latency_ms":0}`
	r, err := DecodeResult([]byte(line))
	if err != nil || r.Format != FormatOpenAICompletions {
		t.Fatalf("DecodeResult: %+v, %v", r, err)
	}
	if b, err := r.Encode(); err != nil || string(b) != line {
		t.Fatalf("Encode: %s, %v", b, err)
	}
	_, err = DecodeResult([]byte(`{"custom_id":"x","batch_id":"b","status":"ok","format":"tinkerfleet","attempts":0,"latency_ms":0}`))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "format" {
		t.Fatalf("a native format spelled out: %v, want a format field error", err)
	}
}

func TestFormatOfResult(t *testing.T) {
	meta := json.RawMessage(`{"format":"openai-chat"}`) // a key of the metadata is not the result's
	for _, tc := range []struct {
		r    Result
		want string
	}{
		{Result{CustomID: "a", BatchID: "b", Status: StatusOK, Model: "m", Format: FormatOpenAIChat}, FormatOpenAIChat},
		{Result{CustomID: "a", BatchID: "b", Status: StatusOK, Format: FormatOpenAICompletions}, FormatOpenAICompletions},
		{Result{CustomID: `"format":"openai-chat"`, BatchID: "b", Status: StatusOK, Model: "m", Metadata: meta}, ""},
		{Result{CustomID: "a", BatchID: "b", Status: StatusOK, Usage: &Usage{}}, ""},
	} {
		data, err := tc.r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if got := FormatOfResult(data); got != tc.want {
			t.Errorf("FormatOfResult(%s) = %q, want %q", data, got, tc.want)
		}
		for i := range data { // cut anywhere: never a panic, and never a format that is not there
			if got := FormatOfResult(data[:i]); got != "" && got != tc.want {
				t.Errorf("FormatOfResult(%q) = %q", data[:i], got)
			}
		}
	}
	for _, junk := range []string{"", "null", "[1]", `{"custom_id"`, `{"custom_id":`, `{"format":7}`, `{"`} {
		if got := FormatOfResult([]byte(junk)); got != "" {
			t.Errorf("FormatOfResult(%q) = %q, want \"\"", junk, got)
		}
	}
}

// TestAppendOpenAIParsesAsOpenAIPythonTypes reads every kind of line AppendOpenAI writes the way
// the official openai-python client's pydantic types would (ChatCompletion, Completion,
// CompletionUsage, ErrorObject, and for lines that asked for logprobs ChoiceLogprobs,
// ChatCompletionTokenLogprob and the completion choice's Logprobs; the batch line itself is the
// OpenAPI spec's BatchRequestOutput): each required field present with its type, each Literal
// one of the values the client knows, Optional fields null or of their type, and logprobs
// non-null, with one entry per sampled token, exactly when asked for. Extra fields
// (reasoning_content) are allowed, as the client allows them.
func TestAppendOpenAIParsesAsOpenAIPythonTypes(t *testing.T) {
	t.Parallel()
	ok := func(format, model string, samples ...Sample) Result {
		return Result{CustomID: "ok-" + format + model, BatchID: "b", Status: StatusOK, Model: model, Format: format,
			Samples: samples, Usage: &Usage{PromptTokens: 9, CompletionTokens: 4, CacheHitTokens: 3}}
	}
	s := func(text, stop string) Sample { return Sample{Text: text, Tokens: []int{1}, StopReason: stop} }
	// with is a sample of a job that asked for logprobs: bytes (a part of a character
	// included, or none without a tokenizer) and logprobs (one NaN, one -inf).
	with := func(text string, tb TokenBytes) Sample {
		return Sample{Text: text, Tokens: []int{7, 8, 9}, Logprobs: Logprobs{-0.25, math.NaN(), math.Inf(-1)}, TokenBytes: tb, StopReason: StopReasonStop}
	}
	logprobs := func(r Result) Result { r.OpenAILogprobs = true; return r }
	tb := TokenBytes{[]byte("a"), {0xe4, 0xbd}, {0xa0}}
	results := []Result{
		logprobs(ok(FormatOpenAIChat, "Qwen/Qwen3-8B", with("a你", tb), with("", nil))),
		logprobs(ok(FormatOpenAIChat, "Qwen/Qwen3-8B", with("<think>\nhm\n</think>\n\nYes", tb))),
		logprobs(ok(FormatOpenAICompletions, "Qwen/Qwen3-8B", with("a你", tb), with("", nil))),
		logprobs(ok(FormatOpenAICompletions, "Qwen/Qwen3-8B", Sample{Text: "", Tokens: []int{}, StopReason: StopReasonLength})),
		ok(FormatOpenAIChat, "Qwen/Qwen3-8B", s("Hi", StopReasonStop), s("", StopReasonLength)),
		ok(FormatOpenAIChat, "Qwen/Qwen3-8B", s("<think>\nhm\n</think>\n\nYes", StopReasonStop)),
		ok(FormatOpenAIChat, "openai/gpt-oss-20b", s("<|channel|>analysis<|message|>cut", StopReasonLength)),
		ok(FormatOpenAICompletions, "tinker://x:train:0/sampler_weights/s", s(" a", StopReasonStop), s(" é\u2028", StopReasonLength)),
		ok("", "m", s("native", StopReasonStop)),
		{CustomID: "no-usage", BatchID: "b", Status: StatusOK, Model: "m", Format: FormatOpenAIChat, Samples: []Sample{s("x", StopReasonStop)}},
		CancelledResult(Job{CustomID: "cc", Model: "m", Format: FormatOpenAIChat}, "b", "batch cancelled"),
	}
	for _, code := range []string{CodeInvalidJob, CodeContextTooLong, CodeTokenize, CodeAPIError, CodeFailedFuture,
		CodeRateLimited, CodeTimeout, CodeDeadLetter, CodeInternal} {
		for _, cat := range []Category{CategoryUser, CategoryServer, CategoryUnknown} {
			results = append(results, Result{CustomID: "e-" + code + string(cat), BatchID: "b", Status: StatusError,
				Model: "m", Format: FormatOpenAICompletions, Error: &ResultError{Code: code, Message: "m", Category: cat}})
		}
	}
	for _, r := range results {
		b, err := r.AppendOpenAI(nil, created)
		if err != nil {
			t.Fatal(err)
		}
		var line map[string]any
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		if err := dec.Decode(&line); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		p := pyChecker{t: t, line: b}
		p.str(line, "id", false)
		p.str(line, "custom_id", false)
		if e := p.obj(line, "error", true); e != nil {
			p.str(e, "code", false)
			p.str(e, "message", false)
		}
		resp := p.obj(line, "response", true)
		if resp == nil {
			continue
		}
		status := p.integer(resp, "status_code", false)
		p.str(resp, "request_id", false)
		body := p.obj(resp, "body", false)
		if status != 200 {
			e := p.obj(body, "error", false) // ErrorObject
			p.str(e, "message", false)
			p.str(e, "type", false)
			p.str(e, "param", true)
			p.str(e, "code", true)
			continue
		}
		p.str(body, "id", false)
		p.integer(body, "created", false)
		p.str(body, "model", false)
		object := p.str(body, "object", false)
		if u := p.obj(body, "usage", true); u != nil { // CompletionUsage
			in, out, total := p.integer(u, "prompt_tokens", false), p.integer(u, "completion_tokens", false), p.integer(u, "total_tokens", false)
			if total != in+out {
				t.Errorf("%s: total_tokens %d is not prompt_tokens + completion_tokens", b, total)
			}
			if d := p.obj(u, "prompt_tokens_details", true); d != nil {
				p.integer(d, "cached_tokens", true)
			}
		}
		choices, ok := body["choices"].([]any)
		if !ok {
			t.Errorf("%s: choices is not a list", b)
		}
		for i, c := range choices {
			if lp, _ := c.(map[string]any)["logprobs"]; (lp != nil) != r.OpenAILogprobs {
				t.Errorf("%s: choice %d has logprobs %v, asked for: %v", b, i, lp, r.OpenAILogprobs)
			}
			tokens := len(r.Samples[i].Tokens)
			choice, _ := c.(map[string]any)
			if p.integer(choice, "index", false) != int64(i) {
				t.Errorf("%s: choice %d has index %v", b, i, choice["index"])
			}
			finish := p.str(choice, "finish_reason", false)
			switch object {
			case "chat.completion": // Choice, ChatCompletionMessage, ChoiceLogprobs
				p.literal(finish, "stop", "length", "tool_calls", "content_filter", "function_call")
				m := p.obj(choice, "message", false)
				p.literal(p.str(m, "role", false), "assistant")
				p.str(m, "content", true)
				p.str(m, "refusal", true)
				if lp := p.obj(choice, "logprobs", true); lp != nil { // ChoiceLogprobs
					content := p.list(lp, "content", true)
					p.list(lp, "refusal", true)
					if len(content) != tokens {
						t.Errorf("%s: %d logprobs for %d tokens", b, len(content), tokens)
					}
					for _, e := range content { // ChatCompletionTokenLogprob
						tl := p.value(e, "content[]")
						p.str(tl, "token", false)
						p.float(tl, "logprob", false)
						for _, c := range p.list(tl, "bytes", true) {
							p.isInt(c, "bytes[]")
						}
						for _, top := range p.list(tl, "top_logprobs", false) { // TopLogprob
							tl := p.value(top, "top_logprobs[]")
							p.str(tl, "token", false)
							p.float(tl, "logprob", false)
							p.list(tl, "bytes", true)
						}
					}
				}
			case "text_completion": // CompletionChoice
				p.literal(finish, "stop", "length", "content_filter")
				p.str(choice, "text", false)
				if _, ok := choice["logprobs"]; !ok {
					t.Errorf("%s: CompletionChoice.logprobs is required (Optional, no default)", b)
				}
				if lp := p.obj(choice, "logprobs", true); lp != nil { // Logprobs
					lists := map[string][]any{}
					for _, k := range []string{"text_offset", "token_logprobs", "tokens", "top_logprobs"} {
						if lists[k] = p.list(lp, k, true); len(lists[k]) != tokens {
							t.Errorf("%s: %d %s for %d tokens", b, len(lists[k]), k, tokens)
						}
					}
					for k := range tokens {
						p.isInt(lists["text_offset"][k], "text_offset[]")
						p.isFloat(lists["token_logprobs"][k], "token_logprobs[]")
						p.isStr(lists["tokens"][k], "tokens[]")
						for _, v := range p.value(lists["top_logprobs"][k], "top_logprobs[]") { // Dict[str, float]
							p.isFloat(v, "top_logprobs[] value")
						}
					}
				}
			default:
				t.Errorf("%s: object %q is neither chat.completion nor text_completion", b, object)
			}
		}
	}
}

// pyChecker checks fields of a decoded line as a pydantic model of openai-python would.
type pyChecker struct {
	t    *testing.T
	line []byte
}

// field returns m[k]; a missing or null field is an error unless optional.
func (p pyChecker) field(m map[string]any, k string, optional bool) (any, bool) {
	p.t.Helper()
	v, ok := m[k]
	if !ok && !optional {
		p.t.Errorf("%s: required field %q missing", p.line, k)
	}
	if ok && v == nil && !optional {
		p.t.Errorf("%s: field %q is null but not Optional", p.line, k)
	}
	return v, ok && v != nil
}

func (p pyChecker) str(m map[string]any, k string, optional bool) string {
	p.t.Helper()
	v, set := p.field(m, k, optional)
	if !set {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		p.t.Errorf("%s: field %q is %T, not str", p.line, k, v)
	}
	return s
}

func (p pyChecker) integer(m map[string]any, k string, optional bool) int64 {
	p.t.Helper()
	v, set := p.field(m, k, optional)
	if !set {
		return 0
	}
	n, ok := v.(json.Number)
	i, err := n.Int64()
	if !ok || err != nil {
		p.t.Errorf("%s: field %q is %v, not int", p.line, k, v)
	}
	return i
}

func (p pyChecker) obj(m map[string]any, k string, optional bool) map[string]any {
	p.t.Helper()
	v, set := p.field(m, k, optional)
	if !set {
		return nil
	}
	o, ok := v.(map[string]any)
	if !ok {
		p.t.Errorf("%s: field %q is %T, not an object", p.line, k, v)
	}
	return o
}

// list returns m[k], which must be a list.
func (p pyChecker) list(m map[string]any, k string, optional bool) []any {
	p.t.Helper()
	v, set := p.field(m, k, optional)
	if !set {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		p.t.Errorf("%s: field %q is %T, not a list", p.line, k, v)
	}
	return l
}

// float checks that m[k] is a number, as pydantic's float takes one.
func (p pyChecker) float(m map[string]any, k string, optional bool) {
	p.t.Helper()
	if v, set := p.field(m, k, optional); set {
		p.isFloat(v, k)
	}
}

// value returns v, an element of a list, which must be an object.
func (p pyChecker) value(v any, what string) map[string]any {
	p.t.Helper()
	o, ok := v.(map[string]any)
	if !ok {
		p.t.Errorf("%s: %s is %T, not an object", p.line, what, v)
	}
	return o
}

func (p pyChecker) isFloat(v any, what string) {
	p.t.Helper()
	n, ok := v.(json.Number)
	if _, err := n.Float64(); !ok || err != nil {
		p.t.Errorf("%s: %s is %v, not float", p.line, what, v)
	}
}

func (p pyChecker) isInt(v any, what string) {
	p.t.Helper()
	n, ok := v.(json.Number)
	if _, err := n.Int64(); !ok || err != nil {
		p.t.Errorf("%s: %s is %v, not int", p.line, what, v)
	}
}

func (p pyChecker) isStr(v any, what string) {
	p.t.Helper()
	if _, ok := v.(string); !ok {
		p.t.Errorf("%s: %s is %v, not str", p.line, what, v)
	}
}

func (p pyChecker) literal(v string, allowed ...string) {
	p.t.Helper()
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	p.t.Errorf("%s: %q is not one of the Literal values %q", p.line, v, allowed)
}

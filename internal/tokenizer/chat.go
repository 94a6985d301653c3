package tokenizer

import (
	"fmt"
	"strings"
	"time"
	"unicode"
)

// Message is one turn of a chat.
type Message struct {
	Role    string `json:"role"` // system, user, assistant or tool
	Content string `json:"content"`
}

// Renderer turns a conversation into prompt tokens in a model family's chat
// format, ending with the generation prompt for the assistant's reply.
type Renderer interface {
	// Render returns the prompt ids. Content is encoded with special tokens
	// as plain text, so a message cannot inject "<|im_end|>" and the like.
	Render(msgs []Message) ([]int, error)
	// StopTokens are the ids that end the assistant's reply.
	StopTokens() []int
	// Family names the chat format, e.g. "qwen3" or "llama3".
	Family() string
}

// RenderOptions tune a renderer.
type RenderOptions struct {
	// Thinking lets Qwen3 and DeepSeek V3.1 think. When false the generation
	// prompt carries an empty "<think>\n\n</think>\n\n" block (Qwen3) or ends
	// with "</think>" (DeepSeek V3.1), as their templates do with thinking off.
	// gpt-oss always reasons and has no such switch: RendererFor refuses it there.
	Thinking bool
	// ReasoningEffort is gpt-oss's "Reasoning:" line: low, medium or high (empty:
	// medium, its template's default). RendererFor refuses it for other families.
	ReasoningEffort string
	// Date is the "Current date" of gpt-oss's system message (its template's
	// strftime_now); the zero time means the day of rendering, in UTC.
	Date time.Time
}

// ChatFamily returns the chat format of a model by its name (a tag after ':' is ignored):
// "qwen3" for Qwen3 models ("Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B-Instruct-2507", ...),
// "llama3" for Llama 3.x ("meta-llama/Llama-3.1-8B-Instruct", ...), "deepseek_v3.1" for
// DeepSeek V3.1 ("deepseek-ai/DeepSeek-V3.1", its Base and Terminus) and "gpt_oss" for
// gpt-oss ("openai/gpt-oss-20b", "openai/gpt-oss-120b"). ok is false for any other model,
// Qwen3.5 and later and the Qwen3 Thinking models among them (their templates are not the
// hybrid Qwen3's): its chats cannot be rendered.
func ChatFamily(model string) (family string, ok bool) {
	name := baseName(model)
	switch {
	// Not "qwen3.5-…", and not "Qwen3-…-Thinking-2507" or "Qwen3-VL-…-Thinking", whose
	// generation prompt always opens "<think>\n": the hybrid template's thinking switch
	// would render their chats wrong either way.
	case strings.Contains(name, "qwen3-") && !strings.Contains(name, "-thinking"):
		return "qwen3", true
	case strings.Contains(name, "llama-3") || strings.Contains(name, "llama3"):
		return "llama3", true
	case strings.Contains(name, "deepseek-v3.1"):
		return "deepseek_v3.1", true
	case strings.Contains(name, "gpt-oss"):
		return "gpt_oss", true
	}
	return "", false
}

// baseName is model's name in lower case, without the tag after ':' (a fine-tuned
// sampler's "Qwen/Qwen3-8B:peft:…"): what a chat template is chosen by.
func baseName(model string) string {
	name := strings.ToLower(model)
	if i := strings.IndexByte(name, ':'); i >= 0 {
		name = name[:i]
	}
	return name
}

// NoChatFamily is why a chat for model cannot be rendered: ChatFamily knows no format for it.
func NoChatFamily(model string) error {
	return fmt.Errorf("no chat template for model %q: tinkerfleet renders the chats of Qwen3 (its hybrid and Instruct models), Llama 3, DeepSeek V3.1 and gpt-oss; send a prompt or prompt_tokens instead", model)
}

// CheckOptions says why opts do not apply to the chats of model, or nil when they do: only
// gpt-oss takes a reasoning effort, and gpt-oss has no thinking switch (it always reasons).
func CheckOptions(model string, opts RenderOptions) error {
	family, _ := ChatFamily(model)
	switch {
	case family == "gpt_oss" && opts.Thinking:
		return fmt.Errorf("%s always reasons: its chat template has no thinking switch (set reasoning_effort: low, medium or high)", model)
	case opts.ReasoningEffort == "":
	case family != "gpt_oss":
		return fmt.Errorf("a reasoning effort applies to gpt-oss chats, not %s", model)
	case opts.ReasoningEffort != "low" && opts.ReasoningEffort != "medium" && opts.ReasoningEffort != "high":
		return fmt.Errorf("reasoning effort %q: want low, medium or high", opts.ReasoningEffort)
	}
	return nil
}

// RendererFor returns the renderer of a model's chat format (ChatFamily). tok must be the
// model's tokenizer; opts must apply to the model (CheckOptions).
func RendererFor(model string, tok *Tokenizer, opts RenderOptions) (Renderer, error) {
	if tok == nil {
		return nil, fmt.Errorf("renderer for %q: nil tokenizer", model)
	}
	family, ok := ChatFamily(model)
	if !ok {
		return nil, NoChatFamily(model)
	}
	if err := CheckOptions(model, opts); err != nil {
		return nil, err
	}
	switch family {
	case "qwen3":
		// The Instruct models (Qwen3-*-Instruct-2507, Qwen3-VL-*-Instruct) do
		// not think: their templates have no enable_thinking switch and no think
		// branch, so no empty think block is added and an assistant's turn is
		// its content as written.
		instruct := strings.Contains(baseName(model), "-instruct")
		return newQwen3(tok, !opts.Thinking && !instruct, instruct)
	case "llama3":
		return newLlama3(tok)
	case "gpt_oss":
		return newGptOss(tok, opts.ReasoningEffort, opts.Date)
	default:
		return newDeepSeekV31(tok, opts.Thinking)
	}
}

// part is a rendered piece: a special token id, or text (id < 0).
type part struct {
	id   int
	text string
}

type parts []part

func (p *parts) special(id int) { *p = append(*p, part{id: id}) }
func (p *parts) text(s string) {
	if n := len(*p); n > 0 && (*p)[n-1].id < 0 {
		(*p)[n-1].text += s
		return
	}
	*p = append(*p, part{id: -1, text: s})
}

// encode encodes text between special tokens as one string, as HF does when
// it tokenizes a rendered template, but never reads special tokens from text.
func (p parts) encode(tok *Tokenizer) []int {
	var out []int
	for _, x := range p {
		if x.id >= 0 {
			out = append(out, x.id)
		} else {
			out = append(out, tok.EncodeText(x.text)...)
		}
	}
	return out
}

func need(tok *Tokenizer, family string, names ...string) ([]int, error) {
	ids := make([]int, len(names))
	for i, n := range names {
		id, ok := tok.TokenID(n)
		if !ok {
			return nil, fmt.Errorf("%s renderer: tokenizer has no %s token", family, n)
		}
		ids[i] = id
	}
	return ids, nil
}

// qwen3 follows the chat_template of Qwen3's tokenizer_config.json (no tools), or with
// instruct set that of the Instruct models (Qwen3-*-Instruct-2507), which renders an
// assistant's content as written: no reasoning is dropped and no think block added.
type qwen3Renderer struct {
	tok            *Tokenizer
	imStart, imEnd int
	stops          []int
	emptyThink     bool
	instruct       bool
}

func newQwen3(tok *Tokenizer, emptyThink, instruct bool) (*qwen3Renderer, error) {
	ids, err := need(tok, "qwen3", "<|im_start|>", "<|im_end|>", "<|endoftext|>")
	if err != nil {
		return nil, err
	}
	return &qwen3Renderer{tok: tok, imStart: ids[0], imEnd: ids[1], stops: []int{ids[1], ids[2]},
		emptyThink: emptyThink, instruct: instruct}, nil
}

func (r *qwen3Renderer) Family() string { return "qwen3" }

func (r *qwen3Renderer) StopTokens() []int { return append([]int(nil), r.stops...) }

func (r *qwen3Renderer) Render(msgs []Message) ([]int, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("qwen3 render: no messages")
	}
	var p parts
	turn := func(role, content string) {
		p.special(r.imStart)
		p.text(role + "\n" + content)
		p.special(r.imEnd)
		p.text("\n")
	}
	if msgs[0].Role == "system" {
		turn("system", msgs[0].Content)
	}
	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role == "user" && !(strings.HasPrefix(m.Content, "<tool_response>") && strings.HasSuffix(m.Content, "</tool_response>")) {
			lastQuery = i
			break
		}
	}
	for i, m := range msgs {
		switch m.Role {
		case "system":
			if i > 0 {
				turn("system", m.Content)
			}
		case "user":
			turn("user", m.Content)
		case "assistant":
			content, reasoning := m.Content, "" // an Instruct model's as written
			if k := strings.Index(m.Content, "</think>"); k >= 0 && !r.instruct {
				content = strings.TrimLeft(m.Content[strings.LastIndex(m.Content, "</think>")+len("</think>"):], "\n")
				before := strings.TrimRight(m.Content[:k], "\n")
				if j := strings.LastIndex(before, "<think>"); j >= 0 {
					before = before[j+len("<think>"):]
				}
				reasoning = strings.TrimLeft(before, "\n")
			}
			p.special(r.imStart)
			if !r.instruct && i > lastQuery && (i == len(msgs)-1 || reasoning != "") {
				p.text("assistant\n<think>\n" + strings.Trim(reasoning, "\n") + "\n</think>\n\n" + strings.TrimLeft(content, "\n"))
			} else {
				p.text("assistant\n" + content)
			}
			p.special(r.imEnd)
			p.text("\n")
		case "tool":
			if i == 0 || msgs[i-1].Role != "tool" {
				p.special(r.imStart)
				p.text("user")
			}
			p.text("\n<tool_response>\n" + m.Content + "\n</tool_response>")
			if i == len(msgs)-1 || msgs[i+1].Role != "tool" {
				p.special(r.imEnd)
				p.text("\n")
			}
		default:
			return nil, fmt.Errorf("qwen3 render: message %d has unknown role %q (want system, user, assistant or tool)", i, m.Role)
		}
	}
	p.special(r.imStart)
	p.text("assistant\n")
	if r.emptyThink {
		p.text("<think>\n\n</think>\n\n")
	}
	return p.encode(r.tok), nil
}

// llama3Renderer follows the Llama 3 Instruct chat_template: BOS, then
// <|start_header_id|>role<|end_header_id|>\n\n content (trimmed) <|eot_id|>.
type llama3Renderer struct {
	tok                         *Tokenizer
	bos, startHeader, endHeader int
	eot                         int
	stops                       []int
}

func newLlama3(tok *Tokenizer) (*llama3Renderer, error) {
	ids, err := need(tok, "llama3", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
	if err != nil {
		return nil, err
	}
	r := &llama3Renderer{tok: tok, bos: ids[0], startHeader: ids[1], endHeader: ids[2], eot: ids[3], stops: []int{ids[3]}}
	for _, name := range []string{"<|eom_id|>", "<|end_of_text|>"} {
		if id, ok := tok.TokenID(name); ok {
			r.stops = append(r.stops, id)
		}
	}
	return r, nil
}

func (r *llama3Renderer) Family() string { return "llama3" }

func (r *llama3Renderer) StopTokens() []int { return append([]int(nil), r.stops...) }

func (r *llama3Renderer) Render(msgs []Message) ([]int, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("llama3 render: no messages")
	}
	var p parts
	p.special(r.bos)
	for i, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant", "tool", "ipython":
		default:
			return nil, fmt.Errorf("llama3 render: message %d has unknown role %q (want system, user, assistant, tool or ipython)", i, m.Role)
		}
		p.special(r.startHeader)
		p.text(m.Role)
		p.special(r.endHeader)
		p.text("\n\n" + pyStrip(m.Content))
		p.special(r.eot)
	}
	p.special(r.startHeader)
	p.text("assistant")
	p.special(r.endHeader)
	p.text("\n\n")
	return p.encode(r.tok), nil
}

// deepseekV31Renderer follows the chat template of DeepSeek V3.1
// (assets/chat_template.jinja; no tool calls): BOS and the system messages
// joined by blank lines, then "<｜User｜>" + content, "<｜Assistant｜></think>" +
// the answer (what comes before a "</think>" in it is dropped) +
// "<｜end▁of▁sentence｜>" (an assistant turn right after a user turn is the
// one that gets the header), "<｜tool▁output▁begin｜>" + content +
// "<｜tool▁output▁end｜>", and after a last user turn the generation prompt
// "<｜Assistant｜>" + "</think>" (thinking off) or "<think>" (on). The think
// tags are written as text, which V3.1's tokenizer reads as its added tokens. A chat must end
// with a user or tool message: after an assistant's the template opens no new turn.
type deepseekV31Renderer struct {
	tok                       *Tokenizer
	bos, eos, user, assistant int
	toolOutBegin, toolOutEnd  int
	thinking                  bool
}

func newDeepSeekV31(tok *Tokenizer, thinking bool) (*deepseekV31Renderer, error) {
	ids, err := need(tok, "deepseek_v3.1", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
		"<｜Assistant｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")
	if err != nil {
		return nil, err
	}
	return &deepseekV31Renderer{tok: tok, bos: ids[0], eos: ids[1], user: ids[2], assistant: ids[3],
		toolOutBegin: ids[4], toolOutEnd: ids[5], thinking: thinking}, nil
}

func (r *deepseekV31Renderer) Family() string { return "deepseek_v3.1" }

func (r *deepseekV31Renderer) StopTokens() []int { return []int{r.eos} }

func (r *deepseekV31Renderer) Render(msgs []Message) ([]int, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("deepseek_v3.1 render: no messages")
	}
	var p parts
	p.special(r.bos)
	var system []string
	for _, m := range msgs {
		if m.Role == "system" {
			system = append(system, m.Content)
		}
	}
	if len(system) > 0 {
		p.text(strings.Join(system, "\n\n"))
	}
	afterUser, afterTool, afterAssistant, turns := false, false, false, 0
	for i, m := range msgs {
		if m.Role != "system" {
			turns++
			afterAssistant = m.Role == "assistant"
		}
		switch m.Role {
		case "system":
		case "user":
			afterUser, afterTool = true, false
			p.special(r.user)
			p.text(m.Content)
		case "assistant":
			if afterUser {
				p.special(r.assistant)
				p.text("</think>")
			}
			content := m.Content
			if !afterTool {
				if _, answer, ok := strings.Cut(content, "</think>"); ok {
					content = answer
				}
			}
			afterUser, afterTool = false, false
			p.text(content)
			p.special(r.eos)
		case "tool":
			afterUser, afterTool = false, true
			p.special(r.toolOutBegin)
			p.text(m.Content)
			p.special(r.toolOutEnd)
		default:
			return nil, fmt.Errorf("deepseek_v3.1 render: message %d has unknown role %q (want system, user, assistant or tool)", i, m.Role)
		}
	}
	// The template opens an assistant turn only after a user's: a chat that ends with an
	// assistant's turn ends at <｜end▁of▁sentence｜>, the stop token, and one of system
	// messages alone has no turn; either would be sampled past its end.
	switch {
	case turns == 0:
		return nil, fmt.Errorf("deepseek_v3.1 render: the chat has system messages only; its template samples after a user or tool message")
	case afterAssistant:
		return nil, fmt.Errorf("deepseek_v3.1 render: the chat ends with an assistant message, which its template closes with <｜end▁of▁sentence｜> and answers with no new turn; end it with a user or tool message")
	}
	if afterUser {
		p.special(r.assistant)
		if r.thinking {
			p.text("<think>")
		} else {
			p.text("</think>")
		}
	}
	return p.encode(r.tok), nil
}

// pyStrip is Jinja's trim (Python str.strip): whitespace as str.isspace sees it.
func pyStrip(s string) string {
	return strings.TrimFunc(s, func(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) })
}

// gptOssRenderer follows gpt-oss's chat template (the harmony format; no tools, no
// builtin tools, no thinking field of past turns). A system message of its own comes
// first: model identity, knowledge cutoff, current date, "Reasoning: <effort>" and the
// valid channels. A first system (or developer) message becomes the developer message,
// "# Instructions\n\n" + content + "\n\n"; later system messages are left out, as the
// template leaves them. Users' turns are <|start|>user<|message|>content<|end|>, past
// assistant turns their final channel only, and the generation prompt is
// <|start|>assistant: the model writes its channels itself.
type gptOssRenderer struct {
	tok                             *Tokenizer
	start, message, end, channelTok int
	stops                           []int
	system                          string // the system message's text, date and effort filled in
}

func newGptOss(tok *Tokenizer, effort string, date time.Time) (*gptOssRenderer, error) {
	ids, err := need(tok, "gpt_oss", "<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>")
	if err != nil {
		return nil, err
	}
	if effort == "" {
		effort = "medium"
	}
	if date.IsZero() {
		date = time.Now()
	}
	r := &gptOssRenderer{tok: tok, start: ids[0], message: ids[1], end: ids[2], channelTok: ids[3],
		stops: []int{ids[4], ids[5]}, // gpt-oss's generation_config.json ends on these and <|endoftext|>
		system: "You are ChatGPT, a large language model trained by OpenAI.\n" +
			"Knowledge cutoff: 2024-06\n" +
			"Current date: " + date.UTC().Format(time.DateOnly) + "\n\n" +
			"Reasoning: " + effort + "\n\n" +
			"# Valid channels: analysis, commentary, final. Channel must be included for every message."}
	if id, ok := tok.TokenID("<|endoftext|>"); ok {
		r.stops = append(r.stops, id)
	}
	return r, nil
}

func (r *gptOssRenderer) Family() string { return "gpt_oss" }

func (r *gptOssRenderer) StopTokens() []int { return append([]int(nil), r.stops...) }

// Render renders msgs as the template does with add_generation_prompt. Where the template
// raises an exception (channel tags in an assistant's content, a tool message with no tool
// call before it, which tinkerfleet cannot express), Render returns an error.
func (r *gptOssRenderer) Render(msgs []Message) ([]int, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("gpt_oss render: no messages")
	}
	var p parts
	turn := func(header, content string) {
		p.special(r.start)
		p.text(header)
		p.special(r.message)
		p.text(content)
		p.special(r.end)
	}
	turn("system", r.system)
	first := 0
	if msgs[0].Role == "system" {
		if msgs[0].Content != "" {
			turn("developer", "# Instructions\n\n"+msgs[0].Content+"\n\n")
		}
		first = 1
	}
	for i := first; i < len(msgs); i++ {
		m := msgs[i]
		switch m.Role {
		case "system": // the template renders only a first system message
		case "user":
			turn("user", m.Content)
		case "assistant":
			if strings.Contains(m.Content, "<|channel|>analysis<|message|>") || strings.Contains(m.Content, "<|channel|>final<|message|>") {
				return nil, fmt.Errorf("gpt_oss render: message %d: an assistant's content holds <|channel|> tags; give its final answer only", i)
			}
			p.special(r.start)
			p.text("assistant")
			p.special(r.channelTok)
			p.text("final")
			p.special(r.message)
			p.text(m.Content)
			p.special(r.end)
		case "tool":
			return nil, fmt.Errorf("gpt_oss render: message %d: a tool message must follow an assistant's tool call, which chat jobs cannot carry", i)
		default:
			return nil, fmt.Errorf("gpt_oss render: message %d has unknown role %q (want system, user or assistant)", i, m.Role)
		}
	}
	p.special(r.start)
	p.text("assistant")
	return p.encode(r.tok), nil
}

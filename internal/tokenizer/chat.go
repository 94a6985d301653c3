package tokenizer

import (
	"fmt"
	"strings"
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
	// Thinking lets Qwen3 think. When false the generation prompt carries an
	// empty "<think>\n\n</think>\n\n" block, as the Qwen3 template does with
	// enable_thinking=false.
	Thinking bool
}

// Families returns the chat formats RendererFor knows.
func Families() []string { return []string{"qwen3", "llama3"} }

// RendererFor picks the chat format of a model by its name: Qwen3 models
// ("Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B-Instruct-2507", ...) and Llama 3.x
// ("meta-llama/Llama-3.1-8B-Instruct", ...). tok must be the model's tokenizer.
func RendererFor(model string, tok *Tokenizer, opts RenderOptions) (Renderer, error) {
	if tok == nil {
		return nil, fmt.Errorf("renderer for %q: nil tokenizer", model)
	}
	name := strings.ToLower(model)
	if i := strings.IndexByte(name, ':'); i >= 0 {
		name = name[:i]
	}
	switch {
	case strings.Contains(name, "qwen3"):
		// The Instruct-2507 models do not think and their template has no
		// enable_thinking switch, so no empty think block is added.
		noThinkBlock := opts.Thinking || strings.Contains(name, "instruct-2507")
		return newQwen3(tok, !noThinkBlock)
	case strings.Contains(name, "llama-3") || strings.Contains(name, "llama3"):
		return newLlama3(tok)
	}
	return nil, fmt.Errorf("no chat renderer for model %q: supported families are %s (Qwen/Qwen3-*, meta-llama/Llama-3*)",
		model, strings.Join(Families(), ", "))
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

// qwen3 follows the chat_template of Qwen3's tokenizer_config.json (no tools).
type qwen3Renderer struct {
	tok            *Tokenizer
	imStart, imEnd int
	stops          []int
	emptyThink     bool
}

func newQwen3(tok *Tokenizer, emptyThink bool) (*qwen3Renderer, error) {
	ids, err := need(tok, "qwen3", "<|im_start|>", "<|im_end|>", "<|endoftext|>")
	if err != nil {
		return nil, err
	}
	return &qwen3Renderer{tok: tok, imStart: ids[0], imEnd: ids[1], stops: []int{ids[1], ids[2]}, emptyThink: emptyThink}, nil
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
			content, reasoning := m.Content, ""
			if k := strings.Index(m.Content, "</think>"); k >= 0 {
				content = strings.TrimLeft(m.Content[strings.LastIndex(m.Content, "</think>")+len("</think>"):], "\n")
				before := strings.TrimRight(m.Content[:k], "\n")
				if j := strings.LastIndex(before, "<think>"); j >= 0 {
					before = before[j+len("<think>"):]
				}
				reasoning = strings.TrimLeft(before, "\n")
			}
			p.special(r.imStart)
			if i > lastQuery && (i == len(msgs)-1 || reasoning != "") {
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

// pyStrip is Jinja's trim (Python str.strip): whitespace as str.isspace sees it.
func pyStrip(s string) string {
	return strings.TrimFunc(s, func(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) })
}

package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postProcessor is the part of tokenizer.json's post_processor this package reads: the special
// tokens HF adds around a single text when add_special_tokens is true, its default (Llama 3's
// <|begin_of_text|>, for one; Qwen's adds none).
type postProcessor struct {
	Type          string                        `json:"type"`
	Processors    []*postProcessor              `json:"processors"`     // Sequence
	Single        []templatePiece               `json:"single"`         // TemplateProcessing
	SpecialTokens map[string]templateSpecialRef `json:"special_tokens"` // TemplateProcessing
	Cls           *[2]json.RawMessage           `json:"cls"`            // Bert and Roberta: [token, id]
	Sep           *[2]json.RawMessage           `json:"sep"`
}

// templatePiece is one item of a TemplateProcessing template: a special token, or the text.
type templatePiece struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// templateSpecialRef is what a TemplateProcessing special token stands for.
type templateSpecialRef struct {
	IDs []int `json:"ids"`
}

// setPostProcessor reads the special tokens p adds before and after a single text. ByteLevel
// adds none. A type this package does not know is refused, and so is a Sequence of two that
// add tokens: HF's second one puts its tokens around the first's, each pair in its own way.
func (t *Tokenizer) setPostProcessor(p *postProcessor) error {
	if p == nil {
		return nil
	}
	switch p.Type {
	case "ByteLevel":
	case "Sequence":
		for _, q := range p.Processors {
			added := len(t.textPrefix) + len(t.textSuffix)
			if err := t.setPostProcessor(q); err != nil {
				return err
			}
			if added > 0 && len(t.textPrefix)+len(t.textSuffix) > added {
				return fmt.Errorf("parse tokenizer.json: unsupported post_processor Sequence of two processors that add tokens")
			}
		}
	case "TemplateProcessing":
		before, seen := true, false
		for _, piece := range p.Single {
			switch {
			case piece.Sequence != nil:
				if piece.Sequence.ID != "A" {
					return fmt.Errorf("parse tokenizer.json: post_processor's single template holds sequence %q; a single text is A", piece.Sequence.ID)
				}
				if seen {
					return fmt.Errorf("parse tokenizer.json: post_processor's single template holds the text twice")
				}
				before, seen = false, true
			case piece.SpecialToken != nil:
				ref, ok := p.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("parse tokenizer.json: post_processor names special token %q, which its special_tokens lack", piece.SpecialToken.ID)
				}
				if before {
					t.textPrefix = append(t.textPrefix, ref.IDs...)
				} else {
					t.textSuffix = append(t.textSuffix, ref.IDs...)
				}
			}
		}
	case "BertProcessing", "RobertaProcessing": // [CLS] text [SEP], <s> text </s>
		cls, err := postProcessorID(p.Cls, "cls")
		if err != nil {
			return err
		}
		sep, err := postProcessorID(p.Sep, "sep")
		if err != nil {
			return err
		}
		t.textPrefix = append(t.textPrefix, cls)
		t.textSuffix = append(t.textSuffix, sep)
	default:
		return fmt.Errorf("parse tokenizer.json: unsupported post_processor %q", p.Type)
	}
	return nil
}

// postProcessorID reads the id of a Bert or Roberta post-processor's [token, id] pair.
func postProcessorID(pair *[2]json.RawMessage, name string) (int, error) {
	var id int
	if pair == nil || json.Unmarshal(pair[1], &id) != nil {
		return 0, fmt.Errorf("parse tokenizer.json: post_processor's %s is not a [token, id] pair", name)
	}
	return id, nil
}

// EncodeAddingSpecialTokens is Encode with the special tokens that the tokenizer's
// post-processor adds around a single text: HF encode(text) with add_special_tokens=true, its
// default, which Tinker's documentation samples with (Llama 3 and DeepSeek V3, whose
// tokenizer.json on the hub add a beginning-of-text token; Qwen's adds none).
func (t *Tokenizer) EncodeAddingSpecialTokens(text string) []int {
	if len(t.textPrefix) == 0 && len(t.textSuffix) == 0 {
		return t.Encode(text)
	}
	ids := append(append([]int(nil), t.textPrefix...), t.Encode(text)...)
	return append(ids, t.textSuffix...)
}

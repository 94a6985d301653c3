package tokenizer

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestEncodeAddingSpecialTokens: the special tokens each kind of post_processor adds around a
// text, on Qwen3's tokenizer.json given that post_processor. The ids are the Rust library's
// (the oracle of testdata/tokenizer/README.md, encode with add_special_tokens=true).
func TestEncodeAddingSpecialTokens(t *testing.T) {
	t.Parallel()
	texts := []string{"Hello, world!", "", "The capital of France is", " leading space", "<|im_start|>user\nhi<|im_end|>", "日本語 ü e\u0301"}
	for _, c := range []struct {
		name, post string
		want       [][]int
	}{
		{"TemplateProcessing", `{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|im_start|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"<|im_end|>","type_id":0}}],"pair":[{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],"special_tokens":{"<|im_start|>":{"id":"<|im_start|>","ids":[151644],"tokens":["<|im_start|>"]},"<|im_end|>":{"id":"<|im_end|>","ids":[151645],"tokens":["<|im_end|>"]}}}`,
			[][]int{{151644, 9707, 11, 1879, 0, 151645}, {151644, 151645}, {151644, 785, 6722, 315, 9625, 374, 151645}, {151644, 6388, 3550, 151645}, {151644, 151644, 872, 198, 6023, 151645, 151645}, {151644, 101059, 102819, 10489, 3958, 151645}}},
		{"Sequence of ByteLevel and a beginning-of-text template", `{"type":"Sequence","processors":[{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false},{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|endoftext|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[{"SpecialToken":{"id":"<|endoftext|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"<|endoftext|>","type_id":1}},{"Sequence":{"id":"B","type_id":1}}],"special_tokens":{"<|endoftext|>":{"id":"<|endoftext|>","ids":[151643],"tokens":["<|endoftext|>"]}}}]}`,
			[][]int{{151643, 9707, 11, 1879, 0}, {151643}, {151643, 785, 6722, 315, 9625, 374}, {151643, 6388, 3550}, {151643, 151644, 872, 198, 6023, 151645}, {151643, 101059, 102819, 10489, 3958}}},
		{"RobertaProcessing", `{"type":"RobertaProcessing","sep":["<|im_end|>",151645],"cls":["<|endoftext|>",151643],"trim_offsets":false,"add_prefix_space":false}`,
			[][]int{{151643, 9707, 11, 1879, 0, 151645}, {151643, 151645}, {151643, 785, 6722, 315, 9625, 374, 151645}, {151643, 6388, 3550, 151645}, {151643, 151644, 872, 198, 6023, 151645, 151645}, {151643, 101059, 102819, 10489, 3958, 151645}}},
		{"BertProcessing", `{"type":"BertProcessing","sep":["<|im_end|>",151645],"cls":["<|im_start|>",151644]}`,
			[][]int{{151644, 9707, 11, 1879, 0, 151645}, {151644, 151645}, {151644, 785, 6722, 315, 9625, 374, 151645}, {151644, 6388, 3550, 151645}, {151644, 151644, 872, 198, 6023, 151645, 151645}, {151644, 101059, 102819, 10489, 3958, 151645}}},
	} {
		tok := qwen3With(t, "post_processor", json.RawMessage(c.post))
		for i, text := range texts {
			if got := tok.EncodeAddingSpecialTokens(text); !slices.Equal(got, c.want[i]) {
				t.Errorf("%s: EncodeAddingSpecialTokens(%q) = %v, HF gives %v", c.name, text, got, c.want[i])
			}
			if got, want := tok.Encode(text), qwen3(t).Encode(text); !slices.Equal(got, want) {
				t.Errorf("%s: Encode(%q) = %v, want %v: it adds nothing", c.name, text, got, want)
			}
		}
	}
	// Qwen3's own post_processor (ByteLevel) adds nothing.
	if got, want := qwen3(t).EncodeAddingSpecialTokens("Hello, world!"), []int{9707, 11, 1879, 0}; !slices.Equal(got, want) {
		t.Errorf("Qwen3: %v, want %v", got, want)
	}
}

func TestAPostProcessorNamingAMissingTokenIsRefused(t *testing.T) {
	t.Parallel()
	data := qwen3JSONWith(t, map[string]any{"post_processor": json.RawMessage(`{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"special_tokens":{}}`)})
	if _, err := Parse(data); err == nil {
		t.Fatal("a template naming a special token it does not define was accepted")
	}
}

// qwen3With is Qwen3's tokenizer with field of its tokenizer.json set to value.
func qwen3With(t testing.TB, field string, value any) *Tokenizer {
	t.Helper()
	tok, err := Parse(qwen3JSONWith(t, map[string]any{field: value}))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

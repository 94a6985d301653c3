package tokenizer

import (
	"bytes"
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

// qwen3JSONWith is Qwen3's tokenizer.json with the given fields replaced, and extra added
// tokens after its own. Only the top level is decoded, once for all tests (the file is 11 MB),
// and the fields left alone are written back as they are: decoding and encoding the file again
// took longer than Parse, under the race detector.
func qwen3JSONWith(t testing.TB, fields map[string]any, extra ...map[string]any) []byte {
	t.Helper()
	top, err := qwen3Top()
	if err != nil {
		t.Fatal(err)
	}
	tj := maps.Clone(top)
	for k, v := range fields {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		tj[k] = raw
	}
	if len(extra) > 0 {
		var added []any
		if err := json.Unmarshal(tj["added_tokens"], &added); err != nil {
			t.Fatal(err)
		}
		for _, a := range extra {
			added = append(added, a)
		}
		raw, err := json.Marshal(added)
		if err != nil {
			t.Fatal(err)
		}
		tj["added_tokens"] = raw
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(tj)) {
		if i > 0 {
			b.WriteByte(',')
		}
		key, _ := json.Marshal(k)
		b.Write(key)
		b.WriteByte(':')
		b.Write(tj[k])
	}
	b.WriteByte('}')
	return b.Bytes()
}

// qwen3Top is the top level of Qwen3's tokenizer.json, its values as they are in the file.
var qwen3Top = sync.OnceValues(func() (map[string]json.RawMessage, error) {
	data, err := unzstd(qwen3Zst)
	if err != nil {
		return nil, err
	}
	var tj map[string]json.RawMessage
	return tj, json.Unmarshal(data, &tj)
})

// addedTok is an added token of tokenizer.json, its flags false but those named.
func addedTok(id int, content string, flags ...string) map[string]any {
	a := map[string]any{"id": id, "content": content, "single_word": false, "lstrip": false,
		"rstrip": false, "normalized": false, "special": false}
	for _, f := range flags {
		a[f] = true
	}
	return a
}

// TestNormalizedAddedTokensWithoutANormalizer: HF matches normalized added tokens in a second
// pass, over what the others left, also when there is no normalizer (DeepSeek V3 has an empty
// Sequence and 15 such tokens); a one-pass match gave other ids where the two kinds overlap.
// The ids are HF's for the same file.
func TestNormalizedAddedTokensWithoutANormalizer(t *testing.T) {
	t.Parallel()
	for _, norm := range []any{nil, map[string]any{"type": "Sequence", "normalizers": []any{}}} {
		tok, err := Parse(qwen3JSONWith(t, map[string]any{"normalizer": norm},
			addedTok(151669, "[[ab", "normalized"), addedTok(151670, "ab]]"),
			addedTok(151671, "<qq"), addedTok(151672, "kqz>", "normalized", "single_word")))
		if err != nil {
			t.Fatal(err)
		}
		for text, want := range map[string][]int{"[[ab]]": {15505, 151670}, "<qqkqz>": {151671, 151672}} {
			if got := tok.Encode(text); !slices.Equal(got, want) {
				t.Errorf("normalizer %v: Encode(%q) = %v, HF's %v", norm, text, got, want)
			}
		}
	}
}

// TestTokenizerJSONThatWouldDifferIsRefused: steps whose effect the package does not follow
// are refused with an error naming them, rather than left out: each gave other ids or text
// than HF's for the same file.
func TestTokenizerJSONThatWouldDifferIsRefused(t *testing.T) {
	t.Parallel()
	split := map[string]any{"type": "Split", "pattern": map[string]any{"Regex": PatternQwen2}, "behavior": "Isolated", "invert": false}
	byteLevel := func(prefix bool) map[string]any {
		return map[string]any{"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": false, "use_regex": false}
	}
	template := func(single ...any) map[string]any {
		return map[string]any{"type": "TemplateProcessing", "single": single, "pair": []any{},
			"special_tokens": map[string]any{"<|im_start|>": map[string]any{"id": "<|im_start|>", "ids": []int{151644}, "tokens": []string{"<|im_start|>"}}}}
	}
	special := map[string]any{"SpecialToken": map[string]any{"id": "<|im_start|>", "type_id": 0}}
	for _, c := range []struct {
		name   string
		fields map[string]any
		want   string
	}{
		{"add_prefix_space after a Split", map[string]any{"pre_tokenizer": map[string]any{"type": "Sequence",
			"pretokenizers": []any{split, byteLevel(true)}}}, "add_prefix_space after a Split"},
		{"a Split after ByteLevel", map[string]any{"pre_tokenizer": map[string]any{"type": "Sequence",
			"pretokenizers": []any{byteLevel(false), split}}}, `pre_tokenizer "Split" after a ByteLevel`},
		{"a Replace decoder", map[string]any{"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "Ġ"}, "content": "_"}, byteLevel(false)}}}, `decoder "Replace"`},
		{"two post-processors that add tokens", map[string]any{"post_processor": map[string]any{"type": "Sequence", "processors": []any{
			template(special, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}),
			map[string]any{"type": "BertProcessing", "cls": []any{"<|im_start|>", 151644}, "sep": []any{"<|im_end|>", 151645}}}}},
			"Sequence of two processors that add tokens"},
		{"an unknown post-processor", map[string]any{"post_processor": map[string]any{"type": "Frobnicate"}}, `post_processor "Frobnicate"`},
		{"sequence B in the single template", map[string]any{"post_processor": template(map[string]any{"Sequence": map[string]any{"id": "B", "type_id": 0}})},
			`holds sequence "B"`},
	} {
		_, err := Parse(qwen3JSONWith(t, c.fields))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.want)
		}
	}
	// What the models served have still parses: a ByteLevel decoder, alone or in a Sequence.
	if _, err := Parse(qwen3JSONWith(t, map[string]any{"decoder": map[string]any{"type": "Sequence", "decoders": []any{byteLevel(false)}}})); err != nil {
		t.Errorf("a Sequence of one ByteLevel decoder: %v", err)
	}
}

// TestAnAddedTokenInTheSpaceRstripTakes: HF finds added tokens over the whole text and then
// strips; a token that begins in the whitespace an rstrip token took is still found. The ids
// are HF's for the same file.
func TestAnAddedTokenInTheSpaceRstripTakes(t *testing.T) {
	t.Parallel()
	tok, err := Parse(qwen3JSONWith(t, nil, addedTok(151669, "<r>", "rstrip"), addedTok(151670, " <sp>"), addedTok(151671, "\n\n<nl>")))
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string][]int{"<r> <sp>": {151669, 151670}, "<r>\n\n<nl>": {151669, 151671}, "<r>  x": {151669, 87}, "<r>   <sp> <r>": {151669, 151670, 220, 151669}} {
		if got := tok.Encode(text); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, HF's %v", text, got, want)
		}
	}
}

// TestAddedTokenIDsAreHFs: HF gives an added token its vocab id when the vocab holds it, else
// the next id after the added tokens before it, whatever tokenizer.json says (it only warns).
// A file whose ids are others is refused: with them, "hello" was 151669 where HF's is 14990,
// and an added token at id 1000 hid the vocab's token there from Decode.
func TestAddedTokenIDsAreHFs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tok  map[string]any
		want string // in the error; "" for none
	}{
		{addedTok(151669, "<ok>"), ""},
		{addedTok(151669, "hello"), `added token "hello" has id 151669, and HF tokenizers gives it 14990`},
		{addedTok(160000, "<gap>"), `added token "<gap>" has id 160000, and HF tokenizers gives it 151669`},
		{addedTok(1000, "<zz>"), `added token "<zz>" has id 1000, and HF tokenizers gives it 151669`},
		{addedTok(151670, "<|im_end|>"), `added token "<|im_end|>" has id 151670, and HF tokenizers gives it 151645`}, // listed twice
	} {
		_, err := Parse(qwen3JSONWith(t, nil, c.tok))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.tok["content"], err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want an error saying %s", c.tok["content"], err, c.want)
		}
	}
}

// TestDeepSeekPatternsAreScannedByHand: DeepSeek V3's three Split patterns, as its
// tokenizer.json spells them, get the hand-written splitters, ten times faster than regexp2
// (BenchmarkEncodeDeepSeekV3): a constant that differs from the file by a character would
// fall back to regexp2 unseen, with the same ids.
func TestDeepSeekPatternsAreScannedByHand(t *testing.T) {
	t.Parallel()
	split := func(pattern string) map[string]any {
		return map[string]any{"type": "Split", "pattern": map[string]any{"Regex": pattern}, "behavior": "Isolated", "invert": false}
	}
	// The patterns as the file's JSON spells them: \r and \n are the characters themselves.
	var patterns []string
	if err := json.Unmarshal([]byte(`["\\p{N}{1,3}", "[一-龥\u3040-ゟ゠-ヿ]+", `+
		`"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`+"`"+`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]`), &patterns); err != nil {
		t.Fatal(err)
	}
	pre := map[string]any{"type": "Sequence", "pretokenizers": []any{split(patterns[0]), split(patterns[1]), split(patterns[2]),
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}}}
	tok, err := Parse(qwen3JSONWith(t, map[string]any{"pre_tokenizer": pre}))
	if err != nil {
		t.Fatal(err)
	}
	if want := (chained{deepSeekDigits{}, deepSeekCJK{}, deepSeekWords{}}); !reflect.DeepEqual(tok.split, want) {
		t.Fatalf("DeepSeek V3's patterns split with %#v, want %#v", tok.split, want)
	}
}

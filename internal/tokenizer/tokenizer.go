package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/dlclark/regexp2"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes and decodes text with one HuggingFace byte-level BPE
// tokenizer.json. It is immutable after Parse and safe for concurrent use.
type Tokenizer struct {
	forms          []norm.Form   // normalizer steps, in order
	split          splitter      // pre-tokenizer Split (or ByteLevel's own regex)
	addPrefixSpace bool          // ByteLevel add_prefix_space
	byteLevel      bool          // the pre-tokenizer has a ByteLevel step (the last one)
	rawAdded       *addedMatcher // added tokens matched before normalization
	normAdded      *addedMatcher // added tokens with normalized=true
	model          *bpe
	added          map[string]*addedToken // content -> token
	idBytes        tokenBytes             // id -> decoded bytes (none for holes)
	special        []bool                 // id -> is a special added token
	// textPrefix and textSuffix are the special tokens the post-processor adds around a
	// single text (EncodeAddingSpecialTokens).
	textPrefix, textSuffix []int
}

// tokenizerFile is the part of tokenizer.json this package reads.
type tokenizerFile struct {
	AddedTokens   []*addedToken  `json:"added_tokens"`
	Normalizer    *component     `json:"normalizer"`
	PreTokenizer  *component     `json:"pre_tokenizer"`
	Decoder       *component     `json:"decoder"`
	PostProcessor *postProcessor `json:"post_processor"`
	Model         *bpeModel      `json:"model"` // decoded in the same pass as the rest
}

type component struct {
	Type           string       `json:"type"`
	Normalizers    []*component `json:"normalizers"`
	Pretokenizers  []*component `json:"pretokenizers"`
	Decoders       []*component `json:"decoders"`
	Pattern        *splitPat    `json:"pattern"`
	Behavior       string       `json:"behavior"`
	Invert         bool         `json:"invert"`
	AddPrefixSpace bool         `json:"add_prefix_space"`
	UseRegex       *bool        `json:"use_regex"`
}

type splitPat struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

type bpeModel struct {
	Type                    string   `json:"type"`
	Vocab                   jsonSpan `json:"vocab"`  // read by readVocab
	Merges                  jsonSpan `json:"merges"` // read by readMerges
	IgnoreMerges            bool     `json:"ignore_merges"`
	ByteFallback            bool     `json:"byte_fallback"`
	Dropout                 *float64 `json:"dropout"`
	ContinuingSubwordPrefix *string  `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string  `json:"end_of_word_suffix"`
}

// Load reads a tokenizer from path: a tokenizer.json, a zstd-compressed
// tokenizer.json.zst, or a directory holding either.
func Load(path string) (*Tokenizer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	if fi.IsDir() {
		found := ""
		for _, name := range []string{"tokenizer.json", "tokenizer.json.zst"} {
			if _, err := os.Stat(filepath.Join(path, name)); err == nil {
				found = filepath.Join(path, name)
				break
			}
		}
		if found == "" {
			return nil, fmt.Errorf("load tokenizer: no tokenizer.json or tokenizer.json.zst in %s", path)
		}
		path = found
	}
	data, err := readBounded(path, maxTokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	if strings.HasSuffix(path, ".zst") {
		if data, err = unzstdBounded(data, maxTokenizerJSON); err != nil {
			return nil, fmt.Errorf("load tokenizer %s: %w", path, &unsupportedError{err})
		}
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	return t, nil
}

// readBounded reads the file at path, of at most limit bytes.
func readBounded(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > limit {
		return nil, fmt.Errorf("%s: more than the %d bytes a tokenizer may have", path, limit)
	}
	return data, nil
}

// unzstd decompresses a zstd-compressed tokenizer.json.
func unzstd(data []byte) ([]byte, error) { return unzstdBounded(data, maxTokenizerJSON) }

// unzstdBounded decompresses data into at most limit bytes.
func unzstdBounded(data []byte, limit int) ([]byte, error) {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(uint64(limit)))
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	defer dec.Close()
	out, err := dec.DecodeAll(data, nil)
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	return out, nil
}

// Parse builds a tokenizer from the contents of a tokenizer.json. It accepts
// byte-level BPE models (Qwen2/2.5/3, Llama 3.x, GPT-2 style) and rejects
// configurations it would not reproduce exactly; its errors wrap ErrUnsupported.
func Parse(data []byte) (*Tokenizer, error) {
	t, err := parse(data)
	if err != nil {
		return nil, &unsupportedError{err}
	}
	return t, nil
}

// unsupportedError is an error of Parse: its text, and ErrUnsupported.
type unsupportedError struct{ err error }

func (e *unsupportedError) Error() string   { return e.err.Error() }
func (e *unsupportedError) Unwrap() []error { return []error{e.err, ErrUnsupported} }

func parse(data []byte) (*Tokenizer, error) {
	if len(data) > maxTokenizerJSON {
		return nil, fmt.Errorf("parse tokenizer.json: %d bytes, more than the %d a tokenizer may have", len(data), maxTokenizerJSON)
	}
	var f tokenizerFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	t := &Tokenizer{}
	if err := t.setNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.setPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.split == nil {
		return nil, errors.New("parse tokenizer.json: pre_tokenizer has no Split or ByteLevel with use_regex; only byte-level BPE is supported")
	}
	if err := checkDecoder(f.Decoder); err != nil {
		return nil, err
	}
	tokens, err := t.setModel(f.Model)
	if err != nil {
		return nil, err
	}
	if err := t.setAdded(f.AddedTokens, tokens); err != nil {
		return nil, err
	}
	if err := t.setPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	for _, id := range append(append([]int(nil), t.textPrefix...), t.textSuffix...) {
		if id < 0 || id > maxTokenID {
			return nil, fmt.Errorf("parse tokenizer.json: post_processor adds token id %d, outside 0..%d", id, maxTokenID)
		}
	}
	return t, nil
}

// checkDecoder accepts a ByteLevel decoder, alone or in a Sequence of ByteLevel steps: Decode
// does what it does. Any other step (Replace, Strip, ...) would change what HF's decode
// gives, and is refused rather than left out.
func checkDecoder(c *component) error {
	if c == nil {
		return errors.New("parse tokenizer.json: no decoder; only byte-level BPE (a ByteLevel decoder) is supported")
	}
	switch c.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		if len(c.Decoders) == 0 {
			return errors.New("parse tokenizer.json: decoder is an empty Sequence; only byte-level BPE (a ByteLevel decoder) is supported")
		}
		for _, d := range c.Decoders {
			if err := checkDecoder(d); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("parse tokenizer.json: unsupported decoder %q; only ByteLevel decoding is supported", c.Type)
}

func (t *Tokenizer) setNormalizer(c *component) error {
	if c == nil {
		return nil
	}
	switch c.Type {
	case "NFC":
		t.forms = append(t.forms, norm.NFC)
	case "NFD":
		t.forms = append(t.forms, norm.NFD)
	case "NFKC":
		t.forms = append(t.forms, norm.NFKC)
	case "NFKD":
		t.forms = append(t.forms, norm.NFKD)
	case "Sequence":
		for _, n := range c.Normalizers {
			if err := t.setNormalizer(n); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("parse tokenizer.json: unsupported normalizer %q", c.Type)
	}
	return nil
}

func (t *Tokenizer) setPreTokenizer(c *component) error {
	if c == nil {
		return errors.New("parse tokenizer.json: no pre_tokenizer")
	}
	if t.byteLevel {
		// HF's later steps would see the byte-level characters (Ġ, Ã©), not the text.
		return fmt.Errorf("parse tokenizer.json: unsupported pre_tokenizer %q after a ByteLevel one", c.Type)
	}
	switch c.Type {
	case "Sequence":
		for _, p := range c.Pretokenizers {
			if err := t.setPreTokenizer(p); err != nil {
				return err
			}
		}
	case "Split":
		if c.Behavior != "Isolated" || c.Invert {
			return fmt.Errorf("parse tokenizer.json: unsupported Split behavior %q (invert %v)", c.Behavior, c.Invert)
		}
		if c.Pattern == nil {
			return errors.New("parse tokenizer.json: Split without pattern")
		}
		var pat string
		switch {
		case c.Pattern.Regex != nil:
			pat = *c.Pattern.Regex
		case c.Pattern.String != nil:
			pat = regexp2.Escape(*c.Pattern.String)
		default:
			return errors.New("parse tokenizer.json: Split pattern is neither Regex nor String")
		}
		sp, err := splitterFor(pat)
		if err != nil {
			return fmt.Errorf("parse tokenizer.json: %w", err)
		}
		t.split = chain(t.split, sp)
	case "ByteLevel":
		if c.AddPrefixSpace && t.split != nil {
			// HF adds the space to every piece the Split cut, not once to the text.
			return errors.New("parse tokenizer.json: unsupported ByteLevel add_prefix_space after a Split")
		}
		t.byteLevel = true
		t.addPrefixSpace = c.AddPrefixSpace
		if c.UseRegex == nil || *c.UseRegex {
			sp, err := splitterFor(PatternGPT2)
			if err != nil {
				return fmt.Errorf("parse tokenizer.json: %w", err)
			}
			t.split = chain(t.split, sp)
		}
	default:
		return fmt.Errorf("parse tokenizer.json: unsupported pre_tokenizer %q", c.Type)
	}
	return nil
}

// splitterFor picks the hand-written scanner for the known patterns (Qwen2, Llama 3,
// o200k and DeepSeek V3's three) and regexp2 for anything else.
func splitterFor(pattern string) (splitter, error) {
	switch pattern {
	case PatternQwen2:
		return scanner{maxDigits: 1}, nil
	case PatternLlama3:
		return scanner{maxDigits: 3}, nil
	case PatternO200k:
		return o200kScanner{}, nil
	case PatternDeepSeekDigits:
		return deepSeekDigits{}, nil
	case PatternDeepSeekCJK:
		return deepSeekCJK{}, nil
	case PatternDeepSeekWords:
		return deepSeekWords{}, nil
	}
	return newRegexSplitter(pattern)
}

// maxTokenizerJSON bounds a tokenizer.json (real ones are 5-35 MB). It also keeps every offset
// into the vocabulary's tables (vocab.go) within their uint32s.
const maxTokenizerJSON = 256 << 20

// maxTokenID bounds the ids a tokenizer.json may give, since tables are as long as the
// largest: far above any real vocabulary (Qwen3's is 151,669, Llama 3's 128,256).
const maxTokenID = 1 << 24

// setModel builds the BPE model and returns its tokens.
func (t *Tokenizer) setModel(m *bpeModel) (tokenList, error) {
	if m == nil {
		return tokenList{}, errors.New("parse tokenizer.json: no model")
	}
	if m.Type != "BPE" {
		return tokenList{}, fmt.Errorf("parse tokenizer.json: model type %q is not BPE", m.Type)
	}
	if m.ByteFallback || m.Dropout != nil ||
		(m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") ||
		(m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return tokenList{}, errors.New("parse tokenizer.json: BPE options byte_fallback, dropout, continuing_subword_prefix and end_of_word_suffix are not supported")
	}
	b := &bpe{ignoreMerges: m.IgnoreMerges, cache: newPieceCache(16)}
	tokens, err := readVocab(m.Vocab)
	if err != nil {
		return tokenList{}, err
	}
	if b.vocab, err = newVocab(&tokens); err != nil {
		return tokenList{}, fmt.Errorf("parse tokenizer.json vocab: %w", err)
	}
	for c := 0; c < 256; c++ {
		id, ok := b.vocab.id(string([]byte{byte(c)}))
		if !ok {
			return tokenList{}, fmt.Errorf("parse tokenizer.json: vocab has no token for byte 0x%02x", c)
		}
		b.byteID[c] = id
	}
	// A BPE vocabulary is made by its merges, one token each, so there are about as many.
	b.merges = make(map[uint64]uint64, len(tokens.ids))
	var rawA, rawB, joined, rawJoined []byte
	err = readMerges(m.Merges, func(rank int, a, c []byte) error {
		rawA, _ = appendByteLevelDecoded(rawA[:0], a)
		rawB, _ = appendByteLevelDecoded(rawB[:0], c)
		joined = append(append(joined[:0], a...), c...)
		rawJoined, _ = appendByteLevelDecoded(rawJoined[:0], joined)
		left, okA := b.vocab.id(string(rawA))
		right, okC := b.vocab.id(string(rawB))
		merged, okM := b.vocab.id(string(rawJoined))
		if !okA || !okC || !okM {
			return fmt.Errorf("(%q %q) uses a token missing from the vocab", a, c)
		}
		// A pair listed twice takes its last rank, as in HF, whose BpeBuilder collects the
		// merges into a map in order.
		b.merges[pairKey(left, right)] = uint64(rank)<<32 | uint64(uint32(merged))
		return nil
	})
	if err != nil {
		return tokenList{}, err
	}
	t.model = b
	return tokens, nil
}

// setAdded sets the added tokens and the bytes of every id: the model's tokens' with the
// added tokens' over them.
func (t *Tokenizer) setAdded(toks []*addedToken, model tokenList) error {
	if err := t.checkAddedIDs(toks, len(model.ids)); err != nil {
		return err
	}
	t.added = make(map[string]*addedToken, len(toks))
	n := 0 // one more than the largest id
	for _, id := range model.ids {
		n = max(n, int(id)+1)
	}
	addedBytes := make(map[int][]byte, len(toks))
	var raw, normed []*addedToken
	for _, a := range toks {
		if a.ID < 0 || a.ID > maxTokenID {
			return fmt.Errorf("parse tokenizer.json: added token %q has id %d, outside 0..%d", a.Content, a.ID, maxTokenID)
		}
		t.added[a.Content] = a
		n = max(n, a.ID+1)
		addedBytes[a.ID], _ = appendByteLevelDecoded(nil, []byte(a.Content))
		if a.Normalized { // matched after normalizing, even with no normalizer: HF matches these second
			c := *a
			c.Content = t.normalize(a.Content)
			normed = append(normed, &c)
		} else {
			raw = append(raw, a)
		}
	}
	at := make([]int32, n) // each id's position in model.ids, plus one; 0 for none
	for i, id := range model.ids {
		at[id] = int32(i + 1)
	}
	t.idBytes = tokenBytes{buf: make([]byte, 0, len(model.buf)), ends: make([]uint32, 0, n)}
	for id := range n {
		if b, ok := addedBytes[id]; ok {
			t.idBytes.add(b)
		} else {
			t.idBytes.add(model.get(int(at[id]) - 1))
		}
	}
	t.special = make([]bool, n)
	for _, a := range toks {
		t.special[a.ID] = a.Special
	}
	t.rawAdded = newAddedMatcher(raw)
	t.normAdded = newAddedMatcher(normed)
	return nil
}

// checkAddedIDs refuses added tokens whose ids in tokenizer.json are not those HF gives them.
// HF does not read them (it warns when they differ): an added token the vocab holds gets its
// vocab id, and any other the next id after the largest added so far, at least the vocab's
// size; a content listed twice keeps its first id. The files of the models served agree.
func (t *Tokenizer) checkAddedIDs(toks []*addedToken, vocabSize int) error {
	given := make(map[string]int, len(toks))
	largest := -1
	for _, a := range toks {
		if a.ID < 0 || a.ID > maxTokenID {
			return fmt.Errorf("parse tokenizer.json: added token %q has id %d, outside 0..%d", a.Content, a.ID, maxTokenID)
		}
		if a.Content == "" {
			continue
		}
		id, seen := given[a.Content]
		inVocab := -1
		if !seen {
			inVocab = t.vocabID(a.Content)
		}
		switch {
		case seen:
		case inVocab >= 0:
			id = inVocab
		case largest >= vocabSize:
			id = largest + 1
		default:
			id = vocabSize
		}
		if id != a.ID {
			return fmt.Errorf("parse tokenizer.json: added token %q has id %d, and HF tokenizers gives it %d (its vocab id, or the next after the added tokens before it)", a.Content, a.ID, id)
		}
		given[a.Content] = id
		largest = max(largest, id)
	}
	return nil
}

// vocabID returns the id of the model token written content in tokenizer.json's vocab, or -1.
// The vocab holds a key by its bytes: those it stands for in the byte-level alphabet, or its
// own when it is not written in it (DeepSeek's "<｜begin▁of▁sentence｜>"), as readVocab did.
func (t *Tokenizer) vocabID(content string) int {
	b, _ := appendByteLevelDecoded(nil, []byte(content))
	if id, ok := t.model.vocab.id(string(b)); ok {
		return int(id)
	}
	return -1
}

func (t *Tokenizer) normalize(s string) string {
	for _, f := range t.forms {
		s = normalizeAsHF(f, s)
	}
	return s
}

// Encode returns the ids of text without adding any special tokens (HF
// encode with add_special_tokens=false). Added and special tokens written
// in the text, such as "<|im_end|>", are recognised as single ids.
func (t *Tokenizer) Encode(text string) []int { return t.encode(text, false) }

// EncodeText is Encode with special tokens in the text treated as plain text
// (HF split_special_tokens=true); non-special added tokens such as "<think>"
// are still recognised. Use it for untrusted content.
func (t *Tokenizer) EncodeText(text string) []int { return t.encode(text, true) }

// Count returns len(Encode(text)).
func (t *Tokenizer) Count(text string) int { return len(t.Encode(text)) }

func (t *Tokenizer) encode(text string, skipSpecial bool) []int {
	out := make([]int, 0, len(text)/4+4)
	t.rawAdded.split(text, skipSpecial, func(seg segment) {
		if seg.tok != nil {
			out = append(out, seg.tok.ID)
			return
		}
		s := t.normalize(seg.text)
		if t.normAdded == nil {
			out = t.appendText(out, s)
			return
		}
		t.normAdded.split(s, skipSpecial, func(seg segment) {
			if seg.tok != nil {
				out = append(out, seg.tok.ID)
				return
			}
			out = t.appendText(out, seg.text)
		})
	})
	return out
}

// appendText pre-tokenizes and BPE-encodes text that holds no added tokens.
func (t *Tokenizer) appendText(out []int, s string) []int {
	if s == "" {
		return out
	}
	if t.addPrefixSpace && s[0] != ' ' {
		s = " " + s
	}
	if sc, ok := t.split.(scanner); ok {
		for i := 0; i < len(s); {
			j := sc.next(s, i)
			out = t.model.appendPiece(out, s[i:j])
			i = j
		}
		return out
	}
	t.split.split(s, func(p string) { out = t.model.appendPiece(out, p) })
	return out
}

// Decode turns ids back into text, keeping special tokens (HF decode with
// skip_special_tokens=false). Unknown ids are skipped, as HF does, and byte
// sequences that are not valid UTF-8 become U+FFFD per maximal subpart.
func (t *Tokenizer) Decode(ids []int) string {
	n := 0
	for _, id := range ids {
		n += len(t.idBytes.get(id))
	}
	buf := make([]byte, 0, n)
	for _, id := range ids {
		buf = append(buf, t.idBytes.get(id)...)
	}
	for _, c := range buf {
		if c >= 0x80 {
			return string(appendLossyUTF8(make([]byte, 0, n+8), buf))
		}
	}
	return string(buf)
}

// AppendTokenBytes appends to dst the bytes that token id stands for: its raw bytes as the
// byte-level vocabulary gives them (a token may be part of a UTF-8 sequence, then they are
// not valid UTF-8 alone), or an added token's content. An unknown id appends nothing, as
// Decode skips it. Decode(ids) is the concatenation of its tokens' bytes, made valid UTF-8.
func (t *Tokenizer) AppendTokenBytes(dst []byte, id int) []byte {
	return append(dst, t.idBytes.get(id)...)
}

// TokenID returns the id of an added token by its content (e.g.
// "<|im_end|>"), or else of the vocabulary token whose text is s.
func (t *Tokenizer) TokenID(s string) (int, bool) {
	if a, ok := t.added[s]; ok {
		return a.ID, true
	}
	id, ok := t.model.vocab.id(s)
	return int(id), ok
}

// IsSpecial reports whether id is a special added token.
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= 0 && id < len(t.special) && t.special[id]
}

// VocabSize returns one more than the largest id, added tokens included.
func (t *Tokenizer) VocabSize() int { return t.idBytes.len() }

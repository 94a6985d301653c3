package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
)

// qwen3Vocab is the committed Qwen3 tokenizer.json's model vocabulary, raw bytes → id.
func qwen3Vocab(t *testing.T) map[string]int32 {
	t.Helper()
	raw := qwen3JSON(t)
	var f struct {
		Model struct {
			Vocab map[string]int32 `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	vocab := make(map[string]int32, len(f.Model.Vocab))
	for tok, id := range f.Model.Vocab {
		b, _ := byteLevelDecode(tok)
		vocab[b] = id
	}
	return vocab
}

// vocabOf indexes tokens as newVocab would a tokenizer.json's.
func vocabOf(t *testing.T, tokens map[string]int32) *vocab {
	t.Helper()
	var list tokenList
	for s, id := range tokens {
		list.add([]byte(s), id)
	}
	v, err := newVocab(&list)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVocabFindsEveryTokenAndNothingElse(t *testing.T) {
	want := qwen3Vocab(t)
	v := vocabOf(t, want)
	for s, id := range want {
		if got, ok := v.id(s); !ok || got != id {
			t.Fatalf("id(%q) = %d, %v; want %d", s, got, ok, id)
		}
		// Strings one byte longer or shorter than a token, tokens themselves or not.
		for _, other := range []string{s + "\x00", s + "e", s[:len(s)-1], "\xff" + s} {
			wantID, in := want[other]
			if got, ok := v.id(other); ok != in || (in && got != wantID) {
				t.Fatalf("id(%q) = %d, %v; want %d, %v", other, got, ok, wantID, in)
			}
		}
	}
	for _, s := range []string{"", strings.Repeat("a", 1000), "\xff\xfe\xfd"} {
		if id, ok := v.id(s); ok {
			t.Errorf("id(%q) = %d, found; it is not a token", s, id)
		}
	}
}

// A table with more tokens than slots' worth of distinct hashes' low bits: probing must
// pass over other tokens' slots, and stop at an empty one for a miss.
func TestVocabProbesPastCollisions(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 5, 100, 4095, 4096} {
		want := map[string]int32{}
		for i := range n {
			want[fmt.Sprintf("t%d", i)] = int32(n - i)
		}
		v := vocabOf(t, want)
		if used := len(v.slots) - countZero(v.slots); used != n || used*3 > len(v.slots)*2 {
			t.Errorf("n=%d: %d of %d slots used, want n and at most 2/3", n, used, len(v.slots))
		}
		for s, id := range want {
			if got, ok := v.id(s); !ok || got != id {
				t.Fatalf("n=%d: id(%q) = %d, %v; want %d", n, s, got, ok, id)
			}
		}
		for i := n; i < n+100; i++ {
			s := fmt.Sprintf("t%d", i)
			if id, ok := v.id(s); ok {
				t.Fatalf("n=%d: id(%q) = %d, found; not a token", n, s, id)
			}
		}
	}
}

// Equal hash bits and length are not equal bytes: a slot forged to give "cd"'s hash bits to
// "ab"'s entry (as a 32-bit collision would) is not a hit for "cd".
func TestVocabComparesBytesAfterHashBits(t *testing.T) {
	v := vocabOf(t, map[string]int32{"ab": 7})
	h := maphash.String(v.seed, "cd")
	clear(v.slots)
	v.slots[h&uint64(len(v.slots)-1)] = h>>32<<32 | 1 // "ab"'s entry is at offset 0
	if id, ok := v.id("cd"); ok {
		t.Errorf(`id("cd") = %d, found "ab"'s entry`, id)
	}
}

func countZero(xs []uint64) (n int) {
	for _, x := range xs {
		if x == 0 {
			n++
		}
	}
	return n
}

func TestTokenBytes(t *testing.T) {
	var tb tokenBytes
	for _, s := range []string{"ab", "", "c", "", "def"} {
		tb.add([]byte(s))
	}
	if tb.len() != 5 {
		t.Errorf("len = %d, want 5", tb.len())
	}
	for id, want := range map[int]string{-1: "", 0: "ab", 1: "", 2: "c", 3: "", 4: "def", 5: "", 1 << 40: ""} {
		if got := tb.get(id); !bytes.Equal(got, []byte(want)) {
			t.Errorf("get(%d) = %q, want %q", id, got, want)
		}
	}
}

// TestAppendTokenBytes: a token's bytes are those of the byte-level vocabulary, a part of a
// UTF-8 sequence included, and an added token's content; an unknown id has none; and the
// bytes of a text's tokens, one after another, are the text.
func TestAppendTokenBytes(t *testing.T) {
	tok := qwen3(t)
	for id, want := range map[int]string{9707: "Hello", 1879: " world", 220: " ", 56568: "你", 100: "\xa7",
		151645: "<|im_end|>", -1: "", 1 << 30: ""} {
		if got := tok.AppendTokenBytes([]byte("x"), id); string(got) != "x"+want {
			t.Errorf("AppendTokenBytes(%q, %d) = %q, want %q", "x", id, got, "x"+want)
		}
	}
	text := "Hello, 你好 🙂 𝔘 <|im_end|>"
	ids := tok.Encode(text)
	var b []byte
	partial := false
	for _, id := range ids {
		n := len(b)
		b = tok.AppendTokenBytes(b, id)
		partial = partial || !utf8.Valid(b[n:])
	}
	if string(b) != text || !partial {
		t.Errorf("bytes of the tokens %v of %q: %q (a token part of a character: %v)", ids, text, b, partial)
	}
}

// The point of the two tables: a parsed tokenizer is a few hundred objects for the garbage
// collector to mark, not one or more per token (Qwen3 has 151,669 tokens).
func TestParsedTokenizerIsFewObjects(t *testing.T) {
	raw := qwen3JSON(t)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tok, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	objects := int64(after.HeapObjects) - int64(before.HeapObjects)
	runtime.KeepAlive(tok)
	if objects > 5_000 {
		t.Errorf("the parsed tokenizer holds %d heap objects; want a few hundred, not one per token of %d", objects, tok.VocabSize())
	}
	t.Logf("%d heap objects for %d tokens", objects, tok.VocabSize())
}

func TestParseRejectsIDsOutOfRange(t *testing.T) {
	for _, tc := range []struct{ name, from, to string }{
		{"vocab negative", `"he":256`, `"he":-1`},
		{"vocab huge", `"he":256`, `"he":99999999`},
		{"added negative", `"id":259`, `"id":-300`},
		{"added huge", `"id":259`, `"id":99999999`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := strings.Replace(string(miniTokenizerJSON(t)), tc.from, tc.to, 1)
			if data == string(miniTokenizerJSON(t)) {
				t.Fatalf("%s not in the mini tokenizer.json", tc.from)
			}
			_, err := Parse([]byte(data))
			if err == nil || !strings.Contains(err.Error(), "outside 0..16777216") {
				t.Errorf("Parse = %v, want an id out of range error", err)
			}
		})
	}
}

// ignore_merges (Llama 3) looks a whole piece up in the vocab before merging.
func TestIgnoreMergesTakesAWholePieceFromTheVocab(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		var doc map[string]any
		if err := json.Unmarshal(miniTokenizerJSON(t), &doc); err != nil {
			t.Fatal(err)
		}
		model := doc["model"].(map[string]any)
		model["vocab"].(map[string]any)["hello"] = 259 // no merge makes it
		model["ignore_merges"] = ignore
		for i, a := range doc["added_tokens"].([]any) { // after the vocab's ids, as HF gives them
			a.(map[string]any)["id"] = 260 + i
		}
		data, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		want := []int{258, 'o'}
		if ignore {
			want = []int{259}
		}
		if got := tok.Encode("hello"); !slices.Equal(got, want) {
			t.Errorf("ignore_merges=%v: Encode(hello) = %v, want %v", ignore, got, want)
		}
		if id, ok := tok.TokenID("hello"); !ok || id != 259 {
			t.Errorf("TokenID(hello) = %d, %v", id, ok)
		}
		if got := tok.Decode([]int{259, 260}); got != "hello<|end|>" {
			t.Errorf("Decode = %q", got)
		}
	}
}

func TestPieceCacheKeepsWhatFitsAndReplacesOnCollision(t *testing.T) {
	c := newPieceCache(4)
	ids := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(1000 + i)
		}
		return out
	}
	for _, tc := range []struct {
		piece string
		ids   []int32
		kept  bool
	}{
		{"a", ids(1), true},
		{strings.Repeat("x", maxCachedPiece), ids(maxCachedIDs), true},
		{strings.Repeat("y", maxCachedPiece+1), ids(1), false},
		{"many", ids(maxCachedIDs + 1), false},
	} {
		c.put(tc.piece, tc.ids)
		got, ok := c.get(tc.piece)
		if ok != tc.kept || (ok && !slices.Equal(got, tc.ids)) {
			t.Errorf("get(%.10q…) after put of %d ids = %v, %v; want kept=%v", tc.piece, len(tc.ids), got, ok, tc.kept)
		}
	}
	// Two pieces in one slot: the later replaces the earlier, which is then a miss.
	first, second := "p0", ""
	for i := 1; second == ""; i++ {
		if s := fmt.Sprintf("p%d", i); maphash.String(c.seed, s)&c.mask == maphash.String(c.seed, first)&c.mask {
			second = s
		}
	}
	c.put(first, ids(2))
	c.put(second, ids(3))
	if got, ok := c.get(first); ok {
		t.Errorf("get(%q) = %v after %q took its slot", first, got, second)
	}
	if got, ok := c.get(second); !ok || !slices.Equal(got, ids(3)) {
		t.Errorf("get(%q) = %v, %v", second, got, ok)
	}
}

// A warm cache gives the ids a cold one computes, and costs the collector one object a
// piece.
func TestWarmPieceCacheIsOneObjectAPiece(t *testing.T) {
	tok, err := Parse(qwen3JSON(t))
	if err != nil {
		t.Fatal(err)
	}
	corpus := buildCorpus(t, 200_000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cold := tok.Encode(corpus)
	runtime.GC()
	runtime.ReadMemStats(&after)
	cached := len(tok.model.cache.slots) - countNil(tok.model.cache.slots)
	if objects := int64(after.HeapObjects) - int64(before.HeapObjects); objects > int64(cached)+1_000 {
		t.Errorf("%d pieces cached hold %d heap objects; want one each", cached, objects)
	}
	if warm := tok.Encode(corpus); !slices.Equal(warm, cold) {
		t.Errorf("warm cache: %d ids, cold: %d; they differ", len(warm), len(cold))
	}
	runtime.KeepAlive(cold)
	t.Logf("%d pieces cached", cached)
}

func countNil(slots []atomic.Pointer[cacheEntry]) (n int) {
	for i := range slots {
		if slots[i].Load() == nil {
			n++
		}
	}
	return n
}

// A tokenizer.json is bounded (maxTokenizerJSON), read from a file or unpacked from zstd: the
// tables' uint32 offsets rely on it, and a small .zst must not unpack into gigabytes. The
// file and zstd paths are checked against a smaller limit, to spare the disk.
func TestTokenizerSizeIsBounded(t *testing.T) {
	if _, err := Parse(make([]byte, maxTokenizerJSON+1)); err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Errorf("Parse of maxTokenizerJSON+1 bytes = %v, want a size error", err)
	}
	const limit = 1 << 16
	for _, size := range []int{limit, limit + 1} {
		dir := t.TempDir()
		data := bytes.Repeat([]byte{' '}, size)
		plain := filepath.Join(dir, "tokenizer.json")
		if err := os.WriteFile(plain, data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := readBounded(plain, limit)
		if size <= limit && (err != nil || len(got) != size) {
			t.Errorf("readBounded of %d bytes, limit %d: %d bytes, %v", size, limit, len(got), err)
		}
		if size > limit && (err == nil || !strings.Contains(err.Error(), "more than the")) {
			t.Errorf("readBounded of %d bytes, limit %d: %v, want a size error", size, limit, err)
		}
		enc, err := zstd.NewWriter(nil)
		if err != nil {
			t.Fatal(err)
		}
		packed := enc.EncodeAll(data, nil)
		enc.Close()
		got, err = unzstdBounded(packed, limit)
		if size <= limit && (err != nil || !bytes.Equal(got, data)) {
			t.Errorf("unzstdBounded to %d bytes, limit %d: %d bytes, %v", size, limit, len(got), err)
		}
		if size > limit && err == nil {
			t.Errorf("unzstdBounded of %d packed bytes to %d, limit %d: no error", len(packed), size, limit)
		}
	}
}

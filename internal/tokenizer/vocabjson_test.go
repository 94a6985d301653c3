package tokenizer

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// tokenizerFiles are the tokenizer.json files at hand: the built-in Qwen3 one, and those the
// golden tests' variables name.
func tokenizerFiles(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{"qwen3": qwen3JSON(t)}
	for name, env := range map[string]string{"llama3": llama3Env, "deepseek-v3": deepseekEnv, "gpt-oss": gptOssEnv} {
		p := os.Getenv(env)
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			p = filepath.Join(p, "tokenizer.json")
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("$%s: %v", env, err)
		}
		files[name] = data
	}
	return files
}

// The vocab and merges as encoding/json decodes them, which Parse used until it read them
// itself: the reference.
type referenceModel struct {
	Model struct {
		Vocab  map[string]int32 `json:"vocab"`
		Merges json.RawMessage  `json:"merges"`
	} `json:"model"`
}

func referenceMerges(t *testing.T, raw json.RawMessage) [][2]string {
	t.Helper()
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs
	}
	pairs = nil // what encoding/json decoded before it failed
	var strs []string
	if err := json.Unmarshal(raw, &strs); err != nil {
		t.Fatal(err)
	}
	for _, s := range strs {
		a, b, _ := strings.Cut(s, " ")
		pairs = append(pairs, [2]string{a, b})
	}
	return pairs
}

// listMap is a tokenList as raw bytes → id, the later of two equal tokens winning.
func listMap(l *tokenList) map[string]int32 {
	m := make(map[string]int32, len(l.ids))
	for i, id := range l.ids {
		m[string(l.get(i))] = id
	}
	return m
}

func TestReadVocabAndMergesMatchEncodingJSON(t *testing.T) {
	for name, data := range tokenizerFiles(t) {
		t.Run(name, func(t *testing.T) {
			var ref referenceModel
			if err := json.Unmarshal(data, &ref); err != nil {
				t.Fatal(err)
			}
			var f tokenizerFile
			if err := json.Unmarshal(data, &f); err != nil {
				t.Fatal(err)
			}
			list, err := readVocab(f.Model.Vocab)
			if err != nil {
				t.Fatal(err)
			}
			want := make(map[string]int32, len(ref.Model.Vocab))
			for tok, id := range ref.Model.Vocab {
				raw, _ := byteLevelDecode(tok)
				want[raw] = id
			}
			if len(list.ids) != len(ref.Model.Vocab) {
				t.Errorf("%d tokens read, encoding/json decodes %d", len(list.ids), len(ref.Model.Vocab))
			}
			if got := listMap(&list); !maps.Equal(got, want) {
				t.Errorf("the vocab read differs from encoding/json's (%d and %d tokens)", len(got), len(want))
			}
			wantMerges := referenceMerges(t, ref.Model.Merges)
			var got [][2]string
			err = readMerges(f.Model.Merges, func(rank int, a, b []byte) error {
				if rank != len(got) {
					t.Fatalf("merge %d after %d", rank, len(got))
				}
				got = append(got, [2]string{string(a), string(b)})
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, wantMerges) {
				t.Errorf("%d merges read, differing from encoding/json's %d", len(got), len(wantMerges))
			}
		})
	}
}

// What a tokenizer.json is made of is garbage once it is parsed: Parse allocates little
// more than the file, in few objects, where decoding the vocab and merges with
// encoding/json took 80 MB in 734,000 objects for Qwen3.
func TestParseAllocatesLittleMoreThanTheFile(t *testing.T) {
	data := qwen3JSON(t)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := Parse(data); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	bytes, objects := after.TotalAlloc-before.TotalAlloc, after.Mallocs-before.Mallocs
	t.Logf("Parse of %d bytes: %d bytes allocated in %d objects", len(data), bytes, objects)
	if bytes > 2*uint64(len(data)) || objects > 20_000 {
		t.Errorf("Parse of %d bytes allocated %d bytes in %d objects; want at most twice the file, in 20,000", len(data), bytes, objects)
	}
}

func TestParseNamesWhatIsWrongInTheVocabAndMerges(t *testing.T) {
	for _, tc := range []struct{ name, from, to, want string }{
		{"fractional id", `"he":256`, `"he":256.5`, `vocab token "he" has id 256.5, not an integer`},
		{"exponent id", `"he":256`, `"he":2e2`, `vocab token "he" has id 2e2, not an integer`},
		{"string id", `"he":256`, `"he":"256"`, `vocab token "he" has id "256", not an integer`},
		{"vocab not an object", `"vocab":{`, `"vocab":"x","v":{`, `vocab is not an object`},
		{"token twice", `"he":256`, `"he":256,"h\u0065":259`, `vocab: token "he" appears more than once`},
		{"no space", `"l l"`, `"ll"`, `merge 1 "ll" has no space`},
		{"merge not a string", `"l l"`, `["l","l"]`, `merge 1 is not a string, as the first merge is`},
		{"missing token", `"he ll"`, `"he lo"`, `merge 2 ("he" "lo") uses a token missing from the vocab`},
		{"merges not an array", `"merges":[`, `"merges":"x","m":[`, `merges is not an array`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mini := string(miniTokenizerJSON(t))
			data := strings.Replace(mini, tc.from, tc.to, 1)
			if data == mini {
				t.Fatalf("%s not in the mini tokenizer.json", tc.from)
			}
			if !json.Valid([]byte(data)) {
				t.Fatalf("not JSON: %s", data)
			}
			_, err := Parse([]byte(data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestReadMergesTakesPairsAndNamesAMergeThatIsNotOne(t *testing.T) {
	for _, tc := range []struct {
		merges string
		read   [][2]string // when it is read
		err    string      // when it is not
	}{
		{merges: `[["a","b"], ["ab", "c"]]`, read: [][2]string{{"a", "b"}, {"ab", "c"}}},
		{merges: ` null `},
		{merges: `[]`},
		{merges: `[["a","b"], ["ab"]]`, err: `merge 1 is not a pair of strings: want ',' at offset 17`},
		{merges: `[["a","b"], ["a","b","c"]]`, err: `merge 1 is not a pair of strings: want ']' at offset 20`},
		{merges: `[["a","b"], "a b"]`, err: `merge 1 is not a pair of strings, as the first merge is`},
		{merges: `[["a","b"], [1, "b"]]`, err: `merge 1 is not a pair of strings: not a string at offset 13`},
	} {
		var got [][2]string
		err := readMerges([]byte(tc.merges), func(_ int, a, b []byte) error {
			got = append(got, [2]string{string(a), string(b)})
			return nil
		})
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.merges, err)
		case tc.err == "" && !slices.Equal(got, tc.read):
			t.Errorf("%s: read %q, want %q", tc.merges, got, tc.read)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error with %q", tc.merges, err, tc.err)
		}
	}
}

// FuzzJSONString holds appendString to encoding/json's decoding of a string, byte for byte:
// escapes, surrogate pairs and lone surrogates, invalid UTF-8.
func FuzzJSONString(f *testing.F) {
	for _, s := range []string{`"ab"`, `"\u0120hello"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83d\u0041"`,
		`"\udc00\ud800\udc00"`, "\"\xff\xfe\"", "\"\xed\xa0\x80\"", `"\/\b\f\n\r\t\\\""`, `"é ĠĊ"`, ` "x" `,
		`"\u00"`, `"\x"`, "\"\x01\"", `"unterminated`, `"\ud800\u`, `"a\"\u00e9\"b"`, `"\\\u0041"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := jsonReader{b: data}
		got, err := r.appendString([]byte("prefix"))
		var want string
		if json.Unmarshal(data, &want) != nil || strings.TrimSpace(string(data)) == "null" {
			return // not a JSON string: any error will do, and no panic
		}
		if err != nil {
			t.Fatalf("appendString(%q): %v; encoding/json decodes %q", data, err, want)
		}
		if string(got) != "prefix"+want {
			t.Fatalf("appendString(%q) = %q, encoding/json decodes %q", data, got[len("prefix"):], want)
		}
		if r.skipSpace() {
			t.Fatalf("appendString(%q) stopped at offset %d", data, r.i)
		}
	})
}

// FuzzReadVocab holds readVocab to encoding/json's map[string]int32 and the range check
// that followed it: the same tokens and ids, and an error exactly where either failed.
func FuzzReadVocab(f *testing.F) {
	for _, s := range []string{`{"a":0,"b":1}`, `{}`, `null`, `{"\u0120a": 16777216}`, `{"a":16777217}`,
		`{"a":-0}`, `{"a":-1}`, `{"a":1.0}`, `{"a":1e2}`, `{"a":"1"}`, `{"a":1,"a":2}`, `[]`, `{"a":99999999999999999999}`,
		` { "x" : 3 , "y":4 } `, `{"a":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		list, err := readVocab(data)
		if !json.Valid(data) {
			return // Parse reads only spans encoding/json found valid; no panic is all
		}
		// The reference: each value decoded as an int32 by encoding/json, but for null, which it
		// took as 0 and readVocab refuses; then the range check.
		var ref map[string]json.RawMessage
		refErr := json.Unmarshal(data, &ref)
		want := make(map[string]int32, len(ref))
		for tok, v := range ref {
			var id int32
			if err := json.Unmarshal(v, &id); err != nil || string(v) == "null" || id < 0 || id > maxTokenID {
				refErr = fmt.Errorf("token %q: id %s", tok, v)
			}
			raw, _ := byteLevelDecode(tok)
			if _, twice := want[raw]; twice {
				return // two tokens with the same bytes: encoding/json's map keeps either one
			}
			want[raw] = id
		}
		if (err != nil) != (refErr != nil) {
			t.Fatalf("readVocab(%s): %v; encoding/json and the range check: %v", data, err, refErr)
		}
		if err != nil {
			return
		}
		if got := listMap(&list); !maps.Equal(got, want) {
			t.Fatalf("readVocab(%s) = %v, want %v", data, got, want)
		}
	})
}

// FuzzReadMerges holds readMerges to encoding/json: the same merges where every one is a
// pair of strings, or every one a string with a space, and an error where they are not.
func FuzzReadMerges(f *testing.F) {
	for _, s := range []string{`[["a","b"],["ab","c"]]`, `["a b","ab c"]`, `[]`, `null`, `["a b c"]`, `["ab"]`,
		`[["a"]]`, `[["a","b","c"]]`, `[["a","b"],"a b"]`, `["a b",["a","b"]]`, `[null]`, `[["\u0120a", "\ud800"]]`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got [][2]string
		err := readMerges(data, func(_ int, a, b []byte) error {
			got = append(got, [2]string{string(a), string(b)})
			return nil
		})
		var elems []any
		if !json.Valid(data) || json.Unmarshal(data, &elems) != nil {
			return // Parse reads only spans encoding/json found valid; no panic is all
		}
		var want [][2]string
		pairs := len(elems) > 0 && func() bool { _, ok := elems[0].([]any); return ok }()
		for _, e := range elems {
			if pair, ok := e.([]any); ok && pairs && len(pair) == 2 {
				a, okA := pair[0].(string)
				b, okB := pair[1].(string)
				if okA && okB {
					want = append(want, [2]string{a, b})
					continue
				}
			}
			if s, ok := e.(string); ok && !pairs {
				if a, b, ok := strings.Cut(s, " "); ok {
					want = append(want, [2]string{a, b})
					continue
				}
			}
			want = nil
			break
		}
		switch {
		case want == nil && len(elems) > 0:
			if err == nil {
				t.Fatalf("readMerges(%s) = %q, want an error", data, got)
			}
		case err != nil:
			t.Fatalf("readMerges(%s): %v; encoding/json: %q", data, err, want)
		case !slices.Equal(got, want):
			t.Fatalf("readMerges(%s) = %q, encoding/json: %q", data, got, want)
		}
	})
}

// A merge listed twice takes its last rank, as HF's BpeBuilder gives it (it collects the
// merges into a map in order). "h e" listed again after "e l" loses "hel" to "e l".
func TestAMergeListedTwiceTakesItsLastRank(t *testing.T) {
	for _, tc := range []struct {
		merges string
		want   []int
	}{
		{`"merges":["h e","l l","he ll","e l"]`, []int{256, 'l'}},
		{`"merges":["h e","l l","he ll","e l","h e"]`, []int{'h', 259}},
	} {
		mini := string(miniTokenizerJSON(t))
		data := strings.Replace(mini, `"merges":["h e","l l","he ll"]`, tc.merges, 1)
		data = strings.Replace(data, `"he":256`, `"he":256,"el":259`, 1)
		// The added tokens come after the vocab, as HF numbers them.
		data = strings.NewReplacer(`"id":259`, `"id":260`, `"id":260`, `"id":261`, `"id":261`, `"id":262`).Replace(data)
		if strings.Count(data, "259") != 1 || !strings.Contains(data, tc.merges) {
			t.Fatalf("the mini tokenizer.json changed: %s", data)
		}
		tok, err := Parse([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.Encode("hel"); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Encode(hel) = %v, want %v", tc.merges, got, tc.want)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
)

func qwen3Path(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "internal", "tokenizer", "builtin", "qwen3", "tokenizer.json.zst")
}

func runTok(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := runTokenize(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return out.String(), err
}

func TestTokenizeEncodeCountDecode(t *testing.T) {
	p := qwen3Path(t)
	in := "Hello, world! This is a test.\n<|im_start|>user\n\nlast line without newline"
	got, err := runTok(t, in, "--tokenizer", p)
	if err != nil {
		t.Fatal(err)
	}
	want := "[9707,11,1879,0,1096,374,264,1273,13]\n[151644,872]\n[]\n[4259,1555,2041,39027]\n"
	if got != want {
		t.Errorf("encode:\n got %q\nwant %q", got, want)
	}
	ids := "[9707,11,1879,0]\n[151644,872,198]\n"
	if got, _ := runTok(t, ids, "--tokenizer", p, "--decode"); got != "\"Hello, world!\"\n\"<|im_start|>user\\n\"\n" {
		t.Errorf("decode = %q", got)
	}
}

// miniTokenizer writes a byte-level BPE tokenizer.json with the 256 byte
// tokens (id = byte value), merges "h e" and "he l", and <|end|> = 258, after them as HF numbers added tokens.
func miniTokenizer(t *testing.T) string {
	var vocab = map[string]int{}
	n := 0
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE) {
			r = rune(256 + n)
			n++
		}
		vocab[string(r)] = b
	}
	vocab["he"], vocab["hel"] = 256, 257
	data, err := json.Marshal(map[string]any{
		"added_tokens": []map[string]any{{"id": 258, "content": "<|end|>", "special": true}},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []map[string]any{
			{"type": "Split", "pattern": map[string]any{"Regex": tokenizer.PatternQwen2}, "behavior": "Isolated"},
			{"type": "ByteLevel", "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"h e", "he l"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(p)
}

func TestTokenizeModes(t *testing.T) {
	p := miniTokenizer(t)
	if got, _ := runTok(t, "help<|end|>\n\nhe", "--tokenizer", p); got != "[257,112,258]\n[]\n[256]\n" {
		t.Errorf("encode = %q", got)
	}
	if got, _ := runTok(t, "help<|end|>\n\nhe", "--tokenizer", p, "--count"); got != "3\n0\n1\n" {
		t.Errorf("count = %q", got)
	}
	if got, _ := runTok(t, `"a\nb"`+"\n", "--tokenizer", p, "--json"); got != "[97,10,98]\n" {
		t.Errorf("json input = %q", got)
	}
	ids := "[257,112,258]\n[97,10,98]\n"
	if got, _ := runTok(t, ids, "--tokenizer", p, "--decode"); got != "\"help<|end|>\"\n\"a\\nb\"\n" {
		t.Errorf("decode = %q", got)
	}
	if got, _ := runTok(t, ids, "--tokenizer", p, "--decode", "--raw"); got != "help<|end|>\na\nb\n" {
		t.Errorf("decode --raw = %q", got)
	}
}

func TestTokenizeModelFromEnvDir(t *testing.T) {
	t.Setenv("TINKERFLEET_TOKENIZER_DIR", qwen3Path(t))
	t.Setenv("HF_HUB_OFFLINE", "1")
	got, err := runTok(t, "Hi\n", "--model", "Qwen/Qwen3-8B")
	if err != nil || got != "[13048]\n" {
		t.Fatalf("got %q, %v", got, err)
	}
}

func TestTokenizeErrors(t *testing.T) {
	p := miniTokenizer(t)
	for _, tc := range []struct {
		args []string
		in   string
		msg  string
	}{
		{nil, "", "exactly one of --model or --tokenizer"},
		{[]string{"--tokenizer", p, "--decode", "--count"}, "", "exclude"},
		{[]string{"--tokenizer", p, "--decode"}, "[1]\nnot json\n", "line 2"},
		{[]string{"--tokenizer", filepath.Join(t.TempDir(), "nope.json")}, "", "load tokenizer"},
	} {
		if _, err := runTok(t, tc.in, tc.args...); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: want error containing %q, got %v", tc.args, tc.msg, err)
		}
	}
}

// TestTokenizeRefusesNullForAStringOrIds: with --json each line must be a JSON string, and with
// --decode an array of ids. A null (a missing prompt, as `jq -c .prompt` prints it) is neither:
// it was taken for the text "null" (one token) and for no ids (""), counting what no job holds.
func TestTokenizeRefusesNullForAStringOrIds(t *testing.T) {
	p := miniTokenizer(t)
	for _, args := range [][]string{{"--json"}, {"--json", "--count"}, {"--decode"}} {
		in := `"he"` + "\nnull\n"
		if args[0] == "--decode" {
			in = "[104]\nnull\n"
		}
		got, err := runTok(t, in, append([]string{"--tokenizer", p}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%v: want an error naming line 2, got %v (output %q)", args, err, got)
		}
	}
}

// endlessLine is stdin of one short line and then a line that never ends: a file with no
// line end piped in by mistake. It fails the read once far more than the line limit is read.
type endlessLine struct {
	head string
	read int
}

func (r *endlessLine) Read(p []byte) (int, error) {
	if r.head != "" {
		n := copy(p, r.head)
		r.head = r.head[n:]
		return n, nil
	}
	if r.read > 4*jobs.DefaultMaxLineBytes {
		return 0, errors.New("read past four times the line limit")
	}
	for i := range p {
		p[i] = 'a'
	}
	r.read += len(p)
	return len(p), nil
}

// TestTokenizeBoundsTheLine: a line over the line limit of job files (8 MiB) is an error that
// names it, found without reading it whole, rather than memory that grows with it.
func TestTokenizeBoundsTheLine(t *testing.T) {
	p := miniTokenizer(t)
	for _, args := range [][]string{{"--tokenizer", p}, {"--tokenizer", p, "--decode"}} {
		var out, errb bytes.Buffer
		err := runTokenize(context.Background(), args, &endlessLine{head: "[104]\n"}, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "8388608 bytes") {
			t.Fatalf("%v: want an error naming line 2 and the limit, got %v", args, err)
		}
		if out.Len() == 0 {
			t.Fatalf("%v: line 1 was not written", args)
		}
	}
	// A line of the limit exactly is read, one byte more is not.
	n := (jobs.DefaultMaxLineBytes - 4) / 2
	line := "[ " + strings.Repeat("1,", n) + "1]"
	if got, err := runTok(t, line+"\n", "--tokenizer", p, "--decode", "--raw"); err != nil || len(got) != n+2 {
		t.Fatalf("a line of %d bytes: %d bytes out, %v", len(line), len(got), err)
	}
	if _, err := runTok(t, "[1]\r\n"+line+" \n", "--tokenizer", p, "--decode"); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("a line of %d bytes: %v", len(line)+1, err)
	}
}

// TestTokenizeJobsPrintsThePromptAWorkerSends: --jobs renders each job line as a worker
// would, whatever its format: a chat with its template (thinking as the job says), a text
// prompt encoded, ids as given; the stop is the job's own with the template's stop tokens
// beside it (as text beside strings). A checkpoint's job needs --model for its base model.
func TestTokenizeJobsPrintsThePromptAWorkerSends(t *testing.T) {
	t.Setenv("HF_HUB_OFFLINE", "1") // Qwen3's tokenizer is built in
	lines := strings.Join([]string{
		`{"custom_id":"chat","model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}]}`,
		`{"custom_id":"think","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":true},"stop":"\n"}}`,
		`{"custom_id":"stop-ids","model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"thinking":true,"sampling_params":{"stop":[13,151645]}}`,
		`{"custom_id":"text","model":"Qwen/Qwen3-8B","prompt":"Hello, world!","sampling_params":{"stop":["."]}}`,
		`{"custom_id":"ids","model_path":"tinker://run/sampler_weights/1","prompt_tokens":[9707,11]}`,
	}, "\n")
	got, err := runTok(t, lines, "--jobs", "--model", "Qwen/Qwen3-8B")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"custom_id":"chat","prompt_tokens":[151644,872,198,13048,151645,198,151644,77091,198,151667,271,151668,271],"prompt":"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n","stop":[151645,151643]}
{"custom_id":"think","prompt_tokens":[151644,872,198,13048,151645,198,151644,77091,198],"prompt":"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n","stop":["\n","<|im_end|>","<|endoftext|>"]}
{"custom_id":"stop-ids","prompt_tokens":[151644,872,198,13048,151645,198,151644,77091,198],"prompt":"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n","stop":[13,151645,151643]}
{"custom_id":"text","prompt_tokens":[9707,11,1879,0],"prompt":"Hello, world!","stop":["."]}
{"custom_id":"ids","prompt_tokens":[9707,11],"prompt":"Hello,"}
`
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	// A line that cannot be rendered is named on stderr and the others go on; the error at
	// the end counts them.
	bad := lines + "\n" + `{"custom_id":"x","model":"Qwen/Qwen3-8B","prompt":"p","colour":1}` + "\n" +
		`{"custom_id":"after","model":"Qwen/Qwen3-8B","prompt":"Hello, world!"}`
	var out, errb bytes.Buffer
	err = runTokenize(context.Background(), []string{"--jobs"}, strings.NewReader(bad), &out, &errb)
	if err == nil || err.Error() != "tokenize: 2 of 7 job lines could not be rendered (named above)" {
		t.Errorf("bad lines: %v, want them counted", err)
	}
	wantErr := "tokenize: stdin:5: job \"ids\" names a checkpoint (model_path): give its base model with --model\n" +
		"tokenize: stdin:6: field colour: unknown field\n"
	if errb.String() != wantErr {
		t.Errorf("stderr:\n%s\nwant:\n%s", errb.String(), wantErr)
	}
	if got, want := strings.Count(out.String(), "\n"), 5; got != want || !strings.Contains(out.String(), `"custom_id":"after"`) {
		t.Errorf("stdout holds %d lines, want the %d good ones, the last after the bad:\n%s", got, want, out.String())
	}
}

// TestTokenizeRefusesATokenizerDirThatIsNotThere: submit tokenize --model (and --jobs) finds
// tokenizers through TINKERFLEET_TOKENIZER_DIR; one that does not exist, a typo, was passed
// over without a word for the built-in, cached or downloaded tokenizer.
func TestTokenizeRefusesATokenizerDirThatIsNotThere(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "tokenizres")
	t.Setenv("TINKERFLEET_TOKENIZER_DIR", missing)
	t.Setenv("HF_HUB_OFFLINE", "1")
	for stdin, args := range map[string][]string{
		"Hi\n": {"--model", "Qwen/Qwen3-8B"},
		`{"custom_id":"a","model":"Qwen/Qwen3-8B","prompt":"Hi"}` + "\n": {"--jobs"},
	} {
		_, err := runTok(t, stdin, args...)
		if err == nil || !strings.Contains(err.Error(), "TINKERFLEET_TOKENIZER_DIR") || !strings.Contains(err.Error(), missing) {
			t.Errorf("tokenize %q: %v, want an error naming TINKERFLEET_TOKENIZER_DIR and %s", args, err, missing)
		}
	}
}

// TestTokenizeBoundsItsErrorOfALine: a --decode line that is not an array of ids is named
// with at most the first bytes of what encoding/json says of it. Before, a number of a
// megabyte of digits made a megabyte of error: encoding/json writes the whole number into
// its message.
func TestTokenizeBoundsItsErrorOfALine(t *testing.T) {
	p := miniTokenizer(t)
	_, err := runTok(t, "["+strings.Repeat("9", 1<<20)+"]\n", "--tokenizer", p, "--decode")
	if err == nil || !strings.Contains(err.Error(), "line 1") || len(err.Error()) > jobs.MaxExcerpt+100 || !strings.HasSuffix(err.Error(), "…") {
		t.Errorf("a number of a megabyte: a %d-byte error, starting %.300q; want one that names line 1, cut", len(err.Error()), err)
	}
}

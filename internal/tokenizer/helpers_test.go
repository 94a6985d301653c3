package tokenizer

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// testdataDir is the repository's testdata/tokenizer directory.
func testdataDir(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "tokenizer")
}

// qwen3JSON is the built-in Qwen3 tokenizer.json.
func qwen3JSON(t testing.TB) []byte {
	t.Helper()
	data, err := unzstd(qwen3Zst)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// loadQwen3 is the committed Qwen3 tokenizer, parsed once for all tests.
var loadQwen3 = sync.OnceValues(func() (*Tokenizer, error) {
	_, file, _, _ := runtime.Caller(0)
	return Load(filepath.Join(filepath.Dir(file), "builtin", "qwen3", "tokenizer.json.zst"))
})

func qwen3(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := loadQwen3()
	if err != nil {
		t.Fatalf("load qwen3: %v", err)
	}
	return tok
}

// llama3Env names the tokenizer.json (or its directory) of Llama 3, which
// is not committed because of its licence; testdata/tokenizer/fetch-llama3.sh fetches it.
const llama3Env = "TINKERFLEET_LLAMA3_TOKENIZER"

var loadLlama3 = sync.OnceValues(func() (*Tokenizer, error) {
	return Load(os.Getenv(llama3Env))
})

func llama3(t testing.TB) *Tokenizer {
	t.Helper()
	if os.Getenv(llama3Env) == "" {
		t.Skipf("%s is not set; run testdata/tokenizer/fetch-llama3.sh DIR and set %s=DIR to run the Llama 3 tests", llama3Env, llama3Env)
	}
	tok, err := loadLlama3()
	if err != nil {
		t.Fatalf("load llama3 from $%s: %v", llama3Env, err)
	}
	return tok
}

// deepseekEnv names the tokenizer.json (or its directory) of DeepSeek V3, fetched like
// Llama 3's by testdata/tokenizer/fetch-deepseek-v3.sh rather than committed.
const deepseekEnv = "TINKERFLEET_DEEPSEEK_V3_TOKENIZER"

func deepseekV3(t testing.TB) *Tokenizer {
	t.Helper()
	p := os.Getenv(deepseekEnv)
	if p == "" {
		t.Skipf("%s is not set; run testdata/tokenizer/fetch-deepseek-v3.sh DIR and set %s to its output to run the DeepSeek V3 tests", deepseekEnv, deepseekEnv)
	}
	tok, err := Load(p)
	if err != nil {
		t.Fatalf("load DeepSeek V3 from $%s: %v", deepseekEnv, err)
	}
	return tok
}

// gptOssEnv names the gpt-oss tokenizer.json (or its directory), fetched by
// testdata/tokenizer/fetch-gpt-oss.sh rather than committed (27 MB).
const gptOssEnv = "TINKERFLEET_GPT_OSS_TOKENIZER"

var loadGptOss = sync.OnceValues(func() (*Tokenizer, error) {
	return Load(os.Getenv(gptOssEnv))
})

func gptOss(t testing.TB) *Tokenizer {
	t.Helper()
	if os.Getenv(gptOssEnv) == "" {
		t.Skipf("%s is not set; run testdata/tokenizer/fetch-gpt-oss.sh DIR and set %s to its output to run the gpt-oss tests", gptOssEnv, gptOssEnv)
	}
	tok, err := loadGptOss()
	if err != nil {
		t.Fatalf("load gpt-oss from $%s: %v", gptOssEnv, err)
	}
	return tok
}

type golden struct {
	Text    string `json:"text"`
	IDs     []int  `json:"ids"`
	Decoded string `json:"decoded"`
}

func readGolden(t testing.TB, name string) []golden {
	t.Helper()
	f, err := os.Open(filepath.Join(testdataDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var in io.Reader = f
	if strings.HasSuffix(name, ".zst") {
		dec, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		defer dec.Close()
		in = dec
	}
	var out []golden
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var g golden
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, g)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s is empty", name)
	}
	return out
}

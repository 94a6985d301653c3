package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// miniTokenizerJSON is a tiny but complete byte-level BPE tokenizer.json:
// the 256 byte tokens, merges h+e, l+l, he+ll, and one special token.
func miniTokenizerJSON(t testing.TB) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	vocab["he"], vocab["ll"], vocab["hell"] = 256, 257, 258
	doc := map[string]any{
		"added_tokens": []map[string]any{
			{"id": 259, "content": "<|end|>", "special": true},
			{"id": 260, "content": "[W]", "special": false, "single_word": true},
			{"id": 261, "content": "[L]", "special": false, "lstrip": true, "rstrip": true},
		},
		"normalizer": map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []map[string]any{
			{"type": "Split", "pattern": map[string]any{"Regex": PatternQwen2}, "behavior": "Isolated", "invert": false},
			{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"h e", "l l", "he ll"}},
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestMiniTokenizerAddedTokenFlags(t *testing.T) {
	tok, err := Parse(miniTokenizerJSON(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"hello", []int{258, 'o'}},
		{"hello<|end|>", []int{258, 'o', 259}},
		{"a [W] b", []int{'a', ' ', 260, ' ', 'b'}}, // single word: matched
		{"a[W]b", []int{'a', '[', 'W', ']', 'b'}},   // inside a word: not a token
		{"a  [L]  b", []int{'a', 261, 'b'}},         // lstrip and rstrip eat the spaces
	} {
		if got := tok.Encode(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if got := tok.EncodeText("<|end|>"); slices.Contains(got, 259) {
		t.Errorf("EncodeText recognised a special token: %v", got)
	}
	// Rust's from_utf8_lossy: one U+FFFD per maximal invalid subpart.
	if got := tok.Decode([]int{0xE2, 0x82, 'A', 0xFF, 9999}); got != "\uFFFDA\uFFFD" {
		t.Errorf("lossy decode = %q", got)
	}
}

func TestTokenizerID(t *testing.T) {
	for in, want := range map[string]string{
		"Qwen/Qwen3-8B":                       "Qwen/Qwen3-8B",
		"Qwen/Qwen3-8B:peft:abc":              "Qwen/Qwen3-8B",
		"meta-llama/Llama-3.1-8B-Instruct":    "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer",
		"meta-llama/Llama-3.3-70B-Instruct:x": "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer",
		"deepseek-ai/DeepSeek-V3.1/base":      "deepseek-ai/DeepSeek-V3.1",
		"gpt2":                                "gpt2",
		"moonshotai/Kimi-K2-Thinking":         "moonshotai/Kimi-K2-Thinking",
	} {
		if got := TokenizerID(in); got != want {
			t.Errorf("TokenizerID(%q) = %q, want %q", in, got, want)
		}
	}
}

// hub is an httptest stand-in for the HuggingFace hub.
type hub struct {
	data     []byte
	token    string // required bearer token, if set
	requests atomic.Int64
}

func (h *hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.requests.Add(1)
	if h.token != "" && r.Header.Get("Authorization") != "Bearer "+h.token {
		http.Error(w, "gated", http.StatusUnauthorized)
		return
	}
	switch r.URL.Path {
	case "/org/mini/resolve/main/tokenizer.json":
		w.Header().Set("X-Repo-Commit", "0123abcd")
		w.Write(h.data)
	case "/org/mini/resolve/main/tokenizer_config.json":
		w.Write([]byte(`{"eos_token":"<|end|>"}`))
	default:
		http.NotFound(w, r)
	}
}

func TestRegistryDownloadsIntoHFCache(t *testing.T) {
	h := &hub{data: miniTokenizerJSON(t)}
	srv := httptest.NewServer(h)
	defer srv.Close()
	home := t.TempDir()
	reg := NewRegistry(Options{HFHome: home, Endpoint: srv.URL})

	// Many goroutines ask at once: one download, one shared tokenizer.
	const n = 32
	toks := make([]*Tokenizer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			tok, err := reg.ForModel(context.Background(), "org/mini/variant:tag")
			if err != nil {
				t.Error(err)
				return
			}
			toks[i] = tok
			if got := tok.Encode("hello"); !slices.Equal(got, []int{258, 'o'}) {
				t.Errorf("Encode = %v", got)
			}
		})
	}
	wg.Wait()
	for _, tok := range toks {
		if tok != toks[0] {
			t.Fatal("goroutines got different tokenizers")
		}
	}
	if got := h.requests.Load(); got != 2 {
		t.Errorf("hub saw %d requests, want 2 (tokenizer.json + tokenizer_config.json)", got)
	}
	snap := filepath.Join(home, "hub", "models--org--mini", "snapshots", "0123abcd")
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(snap, f)); err != nil {
			t.Errorf("cache file missing: %v", err)
		}
	}
	if ref, _ := os.ReadFile(filepath.Join(home, "hub", "models--org--mini", "refs", "main")); string(ref) != "0123abcd" {
		t.Errorf("refs/main = %q", ref)
	}
	left, _ := filepath.Glob(filepath.Join(snap, ".tmp-*"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// A new registry (a new process) finds it in the cache, offline.
	srv.Close()
	tok, err := NewRegistry(Options{HFHome: home, Offline: true}).ForID(context.Background(), "org/mini")
	if err != nil || tok.Count("hello") != 2 {
		t.Fatalf("from cache: %v", err)
	}
}

func TestRegistryHubErrors(t *testing.T) {
	h := &hub{data: miniTokenizerJSON(t), token: "hf_secret_value"}
	srv := httptest.NewServer(h)
	defer srv.Close()

	_, err := NewRegistry(Options{HFHome: t.TempDir(), Endpoint: srv.URL}).ForID(context.Background(), "org/mini")
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Errorf("no token: want a 401 ErrUnauthorized naming HF_TOKEN, got %v", err)
	}
	_, err = NewRegistry(Options{HFHome: t.TempDir(), Endpoint: srv.URL, Token: "wrong_token_xyz"}).ForID(context.Background(), "org/mini")
	if !errors.Is(err, ErrUnauthorized) || strings.Contains(err.Error(), "wrong_token_xyz") {
		t.Errorf("bad token: want ErrUnauthorized without the token in it, got %v", err)
	}
	reg := NewRegistry(Options{HFHome: t.TempDir(), Endpoint: srv.URL, Token: "hf_secret_value"})
	_, err = reg.ForID(context.Background(), "org/missing")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "404") {
		t.Errorf("want a 404 ErrNotFound, got %v", err)
	}
	if _, err := reg.ForID(context.Background(), "org/mini"); err != nil {
		t.Errorf("with the token: %v", err)
	}
	if _, err := reg.ForID(context.Background(), "../etc"); err == nil {
		t.Error("path-escaping id accepted")
	}
	if _, err := NewRegistry(Options{}).ForID(context.Background(), "org/mini"); !errors.Is(err, ErrNotFound) {
		t.Errorf("no dir, no cache: want ErrNotFound, got %v", err)
	}
	// A hub that cannot be reached: the URL is named once, with why.
	gone := httptest.NewServer(h)
	gone.Close()
	_, err = NewRegistry(Options{HFHome: t.TempDir(), Endpoint: gone.URL}).ForID(context.Background(), "org/mini")
	if err == nil || strings.Count(err.Error(), gone.URL) != 1 || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("an unreachable hub: want its URL once and the refusal, got %v", err)
	}
}

// TestRegistryUsesHFHubCache: HF_HUB_CACHE (or the older HUGGINGFACE_HUB_CACHE) moves the hub
// cache out of $HF_HOME/hub, as huggingface_hub reads it: a tokenizer that library cached there
// is found offline, and a download goes there, not under HF_HOME.
func TestRegistryUsesHFHubCache(t *testing.T) {
	h := &hub{data: miniTokenizerJSON(t)}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, name := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"} {
		cache, home := t.TempDir(), t.TempDir()
		env := map[string]string{name: cache, "HF_HOME": home, "HF_ENDPOINT": srv.URL}
		opts := OptionsFromEnv(func(k string) string { return env[k] })
		if _, err := NewRegistry(opts).ForID(context.Background(), "org/mini"); err != nil {
			t.Fatalf("%s: download: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(cache, "models--org--mini", "snapshots", "0123abcd", "tokenizer.json")); err != nil {
			t.Errorf("%s: not downloaded into it: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(home, "hub")); err == nil {
			t.Errorf("%s: a download went under HF_HOME too", name)
		}
		env["HF_HUB_OFFLINE"] = "1"
		opts = OptionsFromEnv(func(k string) string { return env[k] })
		if tok, err := NewRegistry(opts).ForID(context.Background(), "org/mini"); err != nil || tok.Count("hello") != 2 {
			t.Errorf("%s: offline, the cached tokenizer: %v", name, err)
		}
	}
}

// TestRegistryReadsHFTokenFile: without HF_TOKEN the token comes from the file huggingface_hub
// keeps it in (HF_TOKEN_PATH, default $HF_HOME/token), so a Kubernetes secret mounted as a file
// or `huggingface-cli login` opens gated repositories; a refusal names the file, never the token.
func TestRegistryReadsHFTokenFile(t *testing.T) {
	h := &hub{data: miniTokenizerJSON(t), token: "hf_secret_value"}
	srv := httptest.NewServer(h)
	defer srv.Close()
	download := func(env map[string]string) (Options, error) {
		env["HF_ENDPOINT"] = srv.URL
		opts := OptionsFromEnv(func(k string) string { return env[k] })
		_, err := NewRegistry(opts).ForID(context.Background(), "org/mini")
		return opts, err
	}

	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "token"), []byte("hf_secret_value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := download(map[string]string{"HF_HOME": home}); err != nil {
		t.Errorf("token in $HF_HOME/token: %v", err)
	}

	secret := filepath.Join(t.TempDir(), "hf-token")
	if err := os.WriteFile(secret, []byte("  hf_secret_value  "), 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := download(map[string]string{"HF_HOME": t.TempDir(), "HF_TOKEN_PATH": secret}); err != nil {
		t.Errorf("token in HF_TOKEN_PATH: %v", err)
	}

	// HF_TOKEN wins over the file, as in huggingface_hub (a home with a token and nothing cached).
	fresh := t.TempDir()
	if err := os.WriteFile(filepath.Join(fresh, "token"), []byte("hf_secret_value"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := download(map[string]string{"HF_HOME": fresh, "HF_TOKEN": "hf_other_value"})
	if !errors.Is(err, ErrUnauthorized) || opts.TokenFile != "" || !strings.Contains(err.Error(), "HF_TOKEN was sent") {
		t.Errorf("HF_TOKEN beside a token file: want HF_TOKEN sent and refused, got %+v, %v", opts.TokenFile, err)
	}

	// A wrong token in the file: the refusal names the file, not the token.
	wrong := filepath.Join(t.TempDir(), "hf-token")
	if err := os.WriteFile(wrong, []byte("hf_wrong_xyz"), 0o400); err != nil {
		t.Fatal(err)
	}
	_, err = download(map[string]string{"HF_HOME": t.TempDir(), "HF_TOKEN_PATH": wrong})
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), "hf_wrong_xyz") {
		t.Errorf("wrong token in a file: want a refusal naming %s without the token, got %v", wrong, err)
	}

	// No token anywhere: the hint says where one may go.
	missing := filepath.Join(t.TempDir(), "absent")
	_, err = download(map[string]string{"HF_HOME": t.TempDir(), "HF_TOKEN_PATH": missing})
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "set HF_TOKEN, or put a token in "+missing) {
		t.Errorf("no token: want a hint naming HF_TOKEN and %s, got %v", missing, err)
	}
}

func TestRegistryLocalDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "org", "mini"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "org", "mini", "tokenizer.json"), miniTokenizerJSON(t), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(Options{Dir: dir})
	if tok, err := reg.ForModel(context.Background(), "org/mini"); err != nil || tok.Count("hello") != 2 {
		t.Fatalf("per-model subdirectory: %v", err)
	}
	// A direct file serves every model: the committed Qwen3 .zst.
	q := filepath.Join("builtin", "qwen3", "tokenizer.json.zst")
	tok, err := NewRegistry(Options{Dir: q}).ForModel(context.Background(), "Qwen/Qwen3-8B")
	if err != nil || tok.Count("Hello, world! This is a test.") != 9 {
		t.Fatalf("direct file: %v", err)
	}
	env := OptionsFromEnv(func(k string) string {
		return map[string]string{"TINKERFLEET_TOKENIZER_DIR": dir, "HOME": "/h", "HF_TOKEN": "t", "HF_HUB_OFFLINE": "1"}[k]
	})
	if env.Dir != dir || env.HFHome != "/h/.cache/huggingface" || env.Token != "t" || !env.Offline {
		t.Errorf("OptionsFromEnv = %+v", env)
	}
}

// TestConcurrentEncode shares one tokenizer (and its piece cache) between
// goroutines; run with -race.
func TestConcurrentEncode(t *testing.T) {
	tok := qwen3(t)
	corpus := buildCorpus(t, 40_000)
	want := tok.Encode(corpus)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 3 {
				k := (g*997 + i*131) % 1000
				for !utf8.RuneStart(corpus[k]) {
					k++
				}
				part := corpus[k:]
				ids := tok.Encode(part)
				if tok.Decode(ids) != tok.normalize(part) {
					t.Error("round trip failed under concurrency")
					return
				}
			}
			if !slices.Equal(tok.Encode(corpus), want) {
				t.Error("concurrent encode differs")
			}
		})
	}
	wg.Wait()
}

func TestQwen3IsBuiltInAndNeedsNoDownload(t *testing.T) {
	t.Parallel()
	r := NewRegistry(Options{Offline: true})
	tok, err := r.ForModel(context.Background(), "Qwen/Qwen3-30B-A3B")
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("Hello, world! This is a test."); !slices.Equal(got, []int{9707, 11, 1879, 0, 1096, 374, 264, 1273, 13}) {
		t.Fatalf("built-in Qwen3 encodes %v", got)
	}
	if _, err := r.ForModel(context.Background(), "meta-llama/Llama-3.1-8B-Instruct"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Llama 3 offline without files: err = %v, want ErrNotFound", err)
	}
}

// TestADownloadThatDoesNotParseIsNotCached: a hub (or a proxy in front of it) that answers 200
// with something other than a tokenizer.json, an error page say, leaves nothing in the cache, so
// that the next try downloads again rather than failing on the cached page for ever.
func TestADownloadThatDoesNotParseIsNotCached(t *testing.T) {
	good := &hub{data: miniTokenizerJSON(t)}
	var answered atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if answered.Add(1) == 1 {
			w.Header().Set("X-Repo-Commit", "0123abcd")
			w.Write([]byte("<html><body>Service temporarily unavailable</body></html>"))
			return
		}
		good.ServeHTTP(w, r)
	}))
	defer srv.Close()
	home := t.TempDir()
	reg := NewRegistry(Options{HFHome: home, Endpoint: srv.URL})
	now := time.Now()
	reg.now = func() time.Time { return now }
	if _, err := reg.ForID(context.Background(), "org/mini"); err == nil || errors.Is(err, ErrUnsupported) {
		t.Fatalf("an error page: want an error worth another try, not ErrUnsupported; got %v", err)
	}
	if p := reg.cachedPath("org/mini"); p != "" {
		t.Errorf("the error page was cached as %s", p)
	}

	now = now.Add(failedLoadMemory) // the failure is answered from memory until then
	tok, err := reg.ForID(context.Background(), "org/mini")
	if err != nil {
		t.Fatalf("after the hub recovered: %v", err)
	}
	if tok.Count("hello") != 2 {
		t.Errorf("Count(hello) = %d, want 2", tok.Count("hello"))
	}
}

// TestARedirectedDownloadIsCachedUnderItsCommit: the hub answers for a file stored in LFS or
// Xet (gpt-oss's 27 MB tokenizer.json) with a redirect to its CDN; the commit is named by the
// redirect, not by the CDN's answer, and the cache is laid out by it as huggingface_hub lays it.
func TestARedirectedDownloadIsCachedUnderItsCommit(t *testing.T) {
	data := miniTokenizerJSON(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/org/mini/resolve/main/tokenizer.json":
			w.Header().Set("X-Repo-Commit", "0123abcd")
			http.Redirect(w, r, "/cdn/blob", http.StatusFound)
		case "/cdn/blob":
			w.Write(data)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	home := t.TempDir()
	if _, err := NewRegistry(Options{HFHome: home, Endpoint: srv.URL}).ForID(context.Background(), "org/mini"); err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(home, "hub", "models--org--mini")
	if ref, _ := os.ReadFile(filepath.Join(repo, "refs", "main")); string(ref) != "0123abcd" {
		t.Errorf("refs/main = %q, want the commit the hub named, 0123abcd", ref)
	}
	if _, err := os.Stat(filepath.Join(repo, "snapshots", "0123abcd", "tokenizer.json")); err != nil {
		t.Errorf("snapshot of the commit: %v", err)
	}
}

// TestATokenizerThatCannotBeUsedIsErrUnsupported: files that are there but are no tokenizer
// this package reads fail with ErrUnsupported, which no retry mends; a file that cannot be
// read does not.
func TestATokenizerThatCannotBeUsedIsErrUnsupported(t *testing.T) {
	dir := t.TempDir()
	metaspace := filepath.Join(dir, "org", "metaspace")
	broken := filepath.Join(dir, "org", "broken")
	for p, data := range map[string]string{
		filepath.Join(metaspace, "tokenizer.json"):  `{"pre_tokenizer":{"type":"Metaspace"},"model":{"type":"BPE"}}`,
		filepath.Join(broken, "tokenizer.json.zst"): "not zstd",
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reg := NewRegistry(Options{Dir: dir, Offline: true})
	for _, id := range []string{"org/metaspace", "org/broken"} {
		if _, err := reg.ForID(context.Background(), id); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: want ErrUnsupported, got %v", id, err)
		}
	}
	if _, err := Load(filepath.Join(dir, "absent.json")); err == nil || errors.Is(err, ErrUnsupported) {
		t.Errorf("a missing file: want an error other than ErrUnsupported, got %v", err)
	}
}

// TestALargeRefsFileIsNotReadWhole: the HF cache's refs/main names a revision (40 hex digits);
// a file grown large there is read no further than that, not whole into memory, and the
// tokenizer is then not taken from the cache.
func TestALargeRefsFileIsNotReadWhole(t *testing.T) {
	home := t.TempDir()
	repo := filepath.Join(home, "hub", "models--org--mini")
	if err := os.MkdirAll(filepath.Join(repo, "refs"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(repo, "refs", "main"))
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(256 << 20) // sparse: no disk taken
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	r := NewRegistry(Options{HFHome: home, Offline: true})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	p := r.cachedPath("org/mini")
	runtime.ReadMemStats(&after)
	if p != "" {
		t.Errorf("cachedPath = %q, want none", p)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("reading refs/main allocated %d bytes", alloc)
	}
}

// TestAnEndpointsPasswordIsNotShownInErrors: HF_ENDPOINT may name a proxy with a user and
// password in its URL; a download's errors name the URL without them.
func TestAnEndpointsPasswordIsNotShownInErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "absent") {
			http.NotFound(w, r)
			return
		}
		http.Error(w, "down", http.StatusBadGateway)
	}))
	defer srv.Close()
	endpoint := strings.Replace(srv.URL, "http://", "http://proxyuser:s3cret-pw@", 1)
	reg := NewRegistry(Options{HFHome: t.TempDir(), Endpoint: endpoint})
	for _, id := range []string{"org/absent", "org/down"} {
		_, err := reg.ForID(context.Background(), id)
		if err == nil {
			t.Fatalf("%s: no error", id)
		}
		if strings.Contains(err.Error(), "s3cret-pw") || strings.Contains(err.Error(), "proxyuser") {
			t.Errorf("%s: the error shows the endpoint's credentials: %v", id, err)
		}
		if !strings.Contains(err.Error(), "/"+id+"/resolve/main/") {
			t.Errorf("%s: the error does not name the download: %v", id, err)
		}
	}
}

// TestAnEndpointThatDoesNotParseShowsNoPassword: a password of HF_ENDPOINT that holds a '/',
// '#' or '%' not percent-encoded makes the URL unparsable, and the parse error quotes the URL
// (or the piece of the password it took for a port or escape), or parses with the
// password's end in its path: the download's error says what to do without either.
func TestAnEndpointThatDoesNotParseShowsNoPassword(t *testing.T) {
	for _, endpoint := range []string{
		"https://proxyuser:s3cret/pw@127.0.0.1:1", // "s3cret" taken for a port
		"https://proxyuser:s3cret%zz@127.0.0.1:1", // a bad escape
		"https://proxyuser:s3cret#pw@127.0.0.1:1", // a fragment
		"https://proxyuser:12/s3cret@127.0.0.1:1", // parses: host proxyuser:12, the rest a path
	} {
		reg := NewRegistry(Options{HFHome: t.TempDir(), Endpoint: endpoint})
		_, err := reg.ForID(context.Background(), "org/model")
		if err == nil {
			t.Fatalf("%s: no error", endpoint)
		}
		if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "proxyuser") {
			t.Errorf("%s: the error shows the endpoint's credentials: %v", endpoint, err)
		}
		if !strings.Contains(err.Error(), "HF_ENDPOINT") {
			t.Errorf("%s: the error does not name HF_ENDPOINT: %v", endpoint, err)
		}
	}
}

// TestTheHFTokenIsNotSentOverPlainHTTPAfterARedirect: a hub (a mirror in HF_ENDPOINT) that
// redirects a download from https to http on its own host does not get the token in clear
// text; net/http copies Authorization to any redirect of the same host, whatever its scheme,
// where huggingface_hub (requests) drops it.
func TestTheHFTokenIsNotSentOverPlainHTTPAfterARedirect(t *testing.T) {
	const token = "hf_secret_value"
	var clear atomic.Value
	h := &hub{data: miniTokenizerJSON(t)}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		clear.Store(r.Header.Get("Authorization"))
		h.ServeHTTP(w, r)
	}))
	defer plain.Close()
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			t.Errorf("the https hub got Authorization %q", r.Header.Get("Authorization"))
		}
		http.Redirect(w, r, plain.URL+r.URL.Path, http.StatusFound)
	}))
	defer secure.Close()
	reg := NewRegistry(Options{HFHome: t.TempDir(), Endpoint: secure.URL, Token: token, HTTPClient: secure.Client()})
	if _, err := reg.ForID(context.Background(), "org/mini"); err != nil {
		t.Fatal(err)
	}
	if got, _ := clear.Load().(string); got != "" {
		t.Fatalf("the token went over plain HTTP after a redirect: Authorization %q", got)
	}
}

// TestHFTokenIsCleanedAsHuggingFaceHubCleansIt: HF_TOKEN is read as huggingface_hub reads it
// (_clean_token): line breaks and the spaces around it are no part of the token, and one of
// nothing but those is no token, so the token file is read. A secret given to a container as
// an environment variable often ends with the newline of the file it was made from; sent as
// it was, every download failed on a header net/http refuses.
func TestHFTokenIsCleanedAsHuggingFaceHubCleansIt(t *testing.T) {
	h := &hub{data: miniTokenizerJSON(t), token: "hf_secret_value"}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, env := range []string{"hf_secret_value\n", " hf_secret_value\r\n", "hf_secret\n_value"} {
		opts := OptionsFromEnv(func(k string) string {
			return map[string]string{"HF_TOKEN": env, "HF_HOME": t.TempDir(), "HF_ENDPOINT": srv.URL}[k]
		})
		if _, err := NewRegistry(opts).ForID(context.Background(), "org/mini"); err != nil {
			t.Errorf("HF_TOKEN %q: %v", env, err)
		}
	}
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "token"), []byte("hf_secret_value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := OptionsFromEnv(func(k string) string {
		return map[string]string{"HF_TOKEN": " \n", "HF_HOME": home, "HF_ENDPOINT": srv.URL}[k]
	})
	if _, err := NewRegistry(opts).ForID(context.Background(), "org/mini"); err != nil {
		t.Errorf("HF_TOKEN of white space beside a token file: want the file's token, got %v", err)
	}
}

// TestAFailedLoadIsAnsweredFromMemoryForAWhile: every job asks the registry for its model's
// tokenizer, and a prompt_tokens job goes on without one (its text is best effort). A failed
// load was forgotten at once, so every job started a hub request of its own and waited for it,
// all of them behind each one: a fleet whose tokenizer could not be fetched stopped for 1.5-2.3 s
// every few seconds and ran at 0.7 of the capacity. A failure now answers for
// failedLoadMemory, then the next request tries again.
func TestAFailedLoadIsAnsweredFromMemoryForAWhile(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	reg := NewRegistry(Options{HFHome: t.TempDir(), Endpoint: srv.URL})
	now := time.Now()
	reg.now = func() time.Time { return now }
	for range 3 {
		if _, err := reg.ForID(context.Background(), "org/mini"); err == nil {
			t.Fatal("a hub answering 503: want an error")
		}
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("three loads within failedLoadMemory made %d hub requests, want 1", n)
	}
	now = now.Add(failedLoadMemory)
	if _, err := reg.ForID(context.Background(), "org/mini"); err == nil || requests.Load() != 2 {
		t.Fatalf("after failedLoadMemory: err %v, %d hub requests: want the failure tried again", err, requests.Load())
	}
}

// TestADownloadedTokenizerIsUsedWhenTheCacheCannotBeWritten: the cache is only for the next
// process. A tokenizer downloaded and parsed was dropped when the cache could not be written (a
// full disk, a cache directory that cannot be made) or tokenizer_config.json, which no load
// reads, could not be fetched: every job needing it failed, and every failedLoadMemory the
// worker downloaded it again, to drop it again.
func TestADownloadedTokenizerIsUsedWhenTheCacheCannotBeWritten(t *testing.T) {
	h := &hub{data: miniTokenizerJSON(t)}
	srv := httptest.NewServer(h)
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	reg := NewRegistry(Options{HubCache: filepath.Join(file, "hub"), Endpoint: srv.URL,
		Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	tok, err := reg.ForID(context.Background(), "org/mini")
	if err != nil {
		t.Fatalf("a cache that cannot be written: %v", err)
	}
	if !strings.Contains(logged.String(), "not cached") {
		t.Errorf("the cache's failure was not told to Options.Logger: %q", logged.String())
	}
	if got := tok.Encode("hello"); !slices.Equal(got, []int{258, 'o'}) {
		t.Errorf("Encode = %v", got)
	}

	configDown := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/tokenizer_config.json") {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer configDown.Close()
	home := t.TempDir()
	if _, err := NewRegistry(Options{HFHome: home, Endpoint: configDown.URL}).ForID(context.Background(), "org/mini"); err != nil {
		t.Fatalf("tokenizer_config.json answering 503: %v", err)
	}
	if _, err := os.Stat(filepath.Join(home, "hub", "models--org--mini", "refs", "main")); err == nil {
		t.Error("refs/main written without tokenizer_config.json: the next process would not fetch it")
	}
}

// TestASlowDownloadGoesOnAndAStalledOneIsGivenUp: downloads had a limit on the whole transfer
// (2 minutes), which failed every try of a slow but live download (gpt-oss's 27 MB under
// 1.8 Mbit/s) and waited as long for a hub that had stopped sending. A download is now given up
// after the stall timeout without a byte, however long it has run.
func TestASlowDownloadGoesOnAndAStalledOneIsGivenUp(t *testing.T) {
	data := miniTokenizerJSON(t)
	// A piece every tenth of the stall timeout: a loaded machine under -race delays a piece
	// by hundreds of milliseconds (with a piece every 100 ms of a 300 ms timeout, the slow
	// download was given up once in 30 runs), never by most of a second.
	const stall = time.Second
	const pieces = 34 // 3.4 stall timeouts in all
	hang := make(chan struct{})
	defer close(hang)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/tokenizer.json") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Repo-Commit", "0123abcd")
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		sent := pieces
		if strings.HasPrefix(r.URL.Path, "/org/stalled/") {
			sent = 2
		}
		for i := range sent {
			w.Write(data[len(data)*i/pieces : len(data)*(i+1)/pieces])
			w.(http.Flusher).Flush()
			select {
			case <-time.After(stall / 10):
			case <-r.Context().Done():
				return
			}
		}
		if sent < pieces {
			select { // half a body, then nothing
			case <-hang:
			case <-r.Context().Done():
			}
		}
	}))
	defer srv.Close()
	reg := NewRegistry(Options{HFHome: t.TempDir(), Endpoint: srv.URL, HTTPClient: &http.Client{Timeout: time.Hour}})
	reg.stall = stall
	start := time.Now()
	if _, err := reg.ForID(context.Background(), "org/slow"); err != nil {
		t.Fatalf("a slow but live download: %v", err)
	}
	if took := time.Since(start); took < 3*stall {
		t.Fatalf("the slow download took %v, want more than 3 stall timeouts for the test to mean anything", took)
	}
	start = time.Now()
	_, err := reg.ForID(context.Background(), "org/stalled")
	if err == nil || !errors.Is(err, errStalled) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrUnsupported) {
		t.Fatalf("a hub that stops sending: err %v, want the stall timeout's (transient)", err)
	}
	if took := time.Since(start); took > 3*stall {
		t.Errorf("a stalled download was given up after %v, want about the stall timeout (%v)", took, stall)
	}
	t.Log(err)
}

// TestStaleTemporaryFilesAreRemovedFromTheCache: a download is written into the cache through
// a temporary file (.tmp-…) and a rename; a process killed in between left its temporary file
// there for ever, one more at every such kill. The next write into that directory removes
// those older than staleTemp, and leaves a newer one alone: another process may be writing it.
func TestStaleTemporaryFilesAreRemovedFromTheCache(t *testing.T) {
	h := &hub{data: miniTokenizerJSON(t)}
	srv := httptest.NewServer(h)
	defer srv.Close()
	home := t.TempDir()
	repo := filepath.Join(home, "hub", "models--org--mini")
	snap, refs := filepath.Join(repo, "snapshots", "0123abcd"), filepath.Join(repo, "refs")
	long := time.Now().Add(-staleTemp - time.Minute)
	var stale, fresh []string
	for _, dir := range []string{snap, refs} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		old, now := filepath.Join(dir, ".tmp-killed-123"), filepath.Join(dir, ".tmp-writing-456")
		for _, p := range []string{old, now} {
			if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chtimes(old, long, long); err != nil {
			t.Fatal(err)
		}
		stale, fresh = append(stale, old), append(fresh, now)
	}
	if _, err := NewRegistry(Options{HFHome: home, Endpoint: srv.URL}).ForID(context.Background(), "org/mini"); err != nil {
		t.Fatal(err)
	}
	for _, p := range stale {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("a temporary file older than %s was left: %s", staleTemp, p)
		}
	}
	for _, p := range fresh {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a recent temporary file (another process's write) was removed: %v", err)
		}
	}
}

// panickingTransport panics in RoundTrip once release is closed, after saying it was reached.
type panickingTransport struct{ reached, release chan struct{} }

func (p panickingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	close(p.reached)
	<-p.release
	panic("transport exploded")
}

// TestALoadThatPanicsFailsItsWaiters: the worker turns a panic into an error result and goes
// on, so that a load that panicked (a bug met on some tokenizer.json, say) was recovered far
// above ForID and left its entry loading for ever: every request for that tokenizer, then
// and later, waited for it until its context ended, a worker's job for as long as it runs.
// The panic now fails the load for its waiters, with the panic named, and goes on up to the
// request that loaded.
func TestALoadThatPanicsFailsItsWaiters(t *testing.T) {
	tr := panickingTransport{reached: make(chan struct{}), release: make(chan struct{})}
	reg := NewRegistry(Options{HFHome: t.TempDir(), Endpoint: "http://hub.invalid", HTTPClient: &http.Client{Transport: tr}})
	loaderPanic := make(chan any, 1)
	go func() {
		defer func() { loaderPanic <- recover() }()
		_, _ = reg.ForID(context.Background(), "org/mini")
	}()
	<-tr.reached
	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := reg.ForID(ctx, "org/mini")
		waited <- err
	}()
	time.Sleep(50 * time.Millisecond) // the waiter finds the load under way
	close(tr.release)
	if p := <-loaderPanic; p != "transport exploded" {
		t.Errorf("the loading request recovered %v, want the panic itself", p)
	}
	check := func(who string, err error) {
		if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "panicked") || !strings.Contains(err.Error(), "transport exploded") {
			t.Errorf("%s: %v, want an error naming the panic", who, err)
		}
	}
	check("a request waiting on the load", <-waited)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := reg.ForID(ctx, "org/mini")
	check("a request after the panic", err)
}

// TestHuggingFaceHubTokenIsReadAfterHFToken: huggingface_hub reads the token from HF_TOKEN or,
// failing that, the older HUGGING_FACE_HUB_TOKEN (utils/_auth.py, _get_token_from_environment),
// before the token file; a deployment that still set the older name had its gated
// tokenizers refused here. It is read as HF_TOKEN is, after it, and a refusal names it.
func TestHuggingFaceHubTokenIsReadAfterHFToken(t *testing.T) {
	h := &hub{data: miniTokenizerJSON(t), token: "hf_secret_value"}
	srv := httptest.NewServer(h)
	defer srv.Close()
	download := func(env map[string]string) error {
		env["HF_ENDPOINT"], env["HF_HOME"] = srv.URL, t.TempDir()
		_, err := NewRegistry(OptionsFromEnv(func(k string) string { return env[k] })).ForID(context.Background(), "org/mini")
		return err
	}
	if err := download(map[string]string{"HUGGING_FACE_HUB_TOKEN": " hf_secret_value\r\n"}); err != nil {
		t.Errorf("HUGGING_FACE_HUB_TOKEN alone: %v", err)
	}
	err := download(map[string]string{"HF_TOKEN": "hf_other_value", "HUGGING_FACE_HUB_TOKEN": "hf_secret_value"})
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "HF_TOKEN was sent") {
		t.Errorf("HF_TOKEN beside HUGGING_FACE_HUB_TOKEN: want HF_TOKEN sent and refused, got %v", err)
	}
	err = download(map[string]string{"HUGGING_FACE_HUB_TOKEN": "hf_wrong_xyz"})
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "HUGGING_FACE_HUB_TOKEN was sent") || strings.Contains(err.Error(), "hf_wrong_xyz") {
		t.Errorf("a wrong HUGGING_FACE_HUB_TOKEN: want a refusal naming it without the token, got %v", err)
	}
}

// TestARefusalByTheCDNNamesItsHost: the hub answers for a file in LFS or Xet with a redirect to
// its CDN, having checked the token; a 401/403 of the CDN (a signed URL expired, a proxy that
// blocks the CDN's host) was reported as the hub's, with a hint that HF_TOKEN is missing or
// has no access, where the hub had accepted it. It names the host that refused, and neither
// the token nor the signed URL's query.
func TestARefusalByTheCDNNamesItsHost(t *testing.T) {
	const token = "hf_secret_value"
	cdn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Request has expired", http.StatusForbidden)
	}))
	defer cdn.Close()
	hubSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "gated", http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Repo-Commit", "0123abcd")
		http.Redirect(w, r, cdn.URL+"/blob?X-Amz-Signature=sig_value_xyz", http.StatusFound)
	}))
	defer hubSrv.Close()
	cdnHost := strings.TrimPrefix(cdn.URL, "http://")
	for _, opts := range []Options{{Token: token}, {Token: token, TokenFile: "/run/secrets/hf-token"}} {
		opts.HFHome, opts.Endpoint = t.TempDir(), hubSrv.URL
		_, err := NewRegistry(opts).ForID(context.Background(), "org/mini")
		if err == nil || !strings.Contains(err.Error(), cdnHost+" answered 403") || strings.Contains(err.Error(), "hub answered") ||
			strings.Contains(err.Error(), "no access") {
			t.Errorf("a CDN's 403 (token file %q): %v, want an error naming %s as the host that refused, not the token", opts.TokenFile, err, cdnHost)
		}
		if err != nil && (strings.Contains(err.Error(), token) || strings.Contains(err.Error(), "sig_value_xyz")) {
			t.Errorf("the error shows the token or the signed URL: %v", err)
		}
	}
}

package tinker

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

func ptr[T any](v T) *T { return &v }

// The §3.6 example body, byte for byte.
func TestSampleRequestJSONExample(t *testing.T) {
	req := SampleRequest{
		NumSamples: 4,
		Prompt:     EncodedText([]int{151644, 872, 198, 3838, 374}),
		Params: SamplingParams{MaxTokens: ptr(256), Seed: ptr(int64(1234)),
			Stop: Stop{Strings: []string{"<|im_end|>"}}, Temperature: ptr(0.7)},
	}
	got, err := appendSampleRequest(nil, &req, "0b6f3c1e-…:sample:0", 17)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"num_samples":4,"prompt":{"chunks":[{"tokens":[151644,872,198,3838,374],"type":"encoded_text"}]},` +
		`"sampling_params":{"max_tokens":256,"seed":1234,"stop":["<|im_end|>"],"temperature":0.7,"top_k":-1,"top_p":1.0},` +
		`"sampling_session_id":"0b6f3c1e-…:sample:0","seq_id":17,"prompt_logprobs":false,"topk_prompt_logprobs":0,"type":"sample"}`
	if string(got) != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}
}

// Defaults are always sent, nulls omitted (§T2, Appendix A), and the other chunk
// types follow §T1.
func TestSampleRequestJSONDefaultsAndChunks(t *testing.T) {
	req := SampleRequest{NumSamples: 2, Prompt: EncodedText([]int{1, 2, 3}), Params: SamplingParams{MaxTokens: ptr(32)}}
	got, err := appendSampleRequest(nil, &req, "5d2c:sample:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"num_samples":2,"prompt":{"chunks":[{"tokens":[1,2,3],"type":"encoded_text"}]},` +
		`"sampling_params":{"max_tokens":32,"temperature":1.0,"top_k":-1,"top_p":1.0},` +
		`"sampling_session_id":"5d2c:sample:0","seq_id":0,"prompt_logprobs":false,"topk_prompt_logprobs":0,"type":"sample"}`
	if string(got) != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}

	req = SampleRequest{
		Prompt: ModelInput{Chunks: []Chunk{
			{Type: ChunkEncodedText, Tokens: []int{151644}},
			{Type: ChunkImage, Data: []byte("\x89PNG"), Format: "png", ExpectedTokens: ptr(256)},
			{Type: ChunkImageAssetPointer, Format: "jpeg", Location: "s3://b/\"x\".jpg"},
		}},
		Params:             SamplingParams{Stop: Stop{Tokens: []int{151645, 2}}, TopK: ptr(50), TopP: ptr(0.95), Temperature: ptr(1e-05)},
		PromptLogprobs:     true,
		TopKPromptLogprobs: 5,
	}
	got, err = appendSampleRequest(nil, &req, "s\n1", 1_000_000_000_000_000_007)
	if err != nil {
		t.Fatal(err)
	}
	want = `{"num_samples":1,"prompt":{"chunks":[{"tokens":[151644],"type":"encoded_text"},` +
		`{"data":"iVBORw==","format":"png","expected_tokens":256,"type":"image"},` +
		`{"format":"jpeg","location":"s3://b/\"x\".jpg","type":"image_asset_pointer"}]},` +
		`"sampling_params":{"stop":[151645,2],"temperature":1e-05,"top_k":50,"top_p":0.95},` +
		`"sampling_session_id":"s\n1","seq_id":1000000000000000007,"prompt_logprobs":true,"topk_prompt_logprobs":5,"type":"sample"}`
	if string(got) != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}
	if !json.Valid(got) {
		t.Fatal("invalid JSON")
	}
	if _, err := appendSampleRequest(nil, &SampleRequest{Prompt: EncodedText([]int{1}), Params: SamplingParams{TopP: ptr(math.NaN())}}, "s", 0); err == nil {
		t.Fatal("NaN top_p accepted")
	}
}

func TestAppendStringEscapes(t *testing.T) {
	for _, s := range []string{"plain", "quote\" back\\slash", "ctl\x00\x1f\t\r\n", "utf8 …é", "bad \xff utf8"} {
		b := appendString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%q -> %s: %v", s, b, err)
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); back != want {
			t.Fatalf("round trip %q -> %q", s, back)
		}
	}
}

func TestModelInputEstimateAndLength(t *testing.T) {
	m := ModelInput{Chunks: []Chunk{
		{Type: ChunkEncodedText, Tokens: make([]int, 7)},
		{Type: ChunkImage, Data: make([]byte, 100), ExpectedTokens: ptr(30)},
		{Type: ChunkImageAssetPointer, Location: "abcd", ExpectedTokens: ptr(3)},
	}}
	if got := m.EstimatedBytes(); got != 70+100+4 {
		t.Fatalf("EstimatedBytes = %d", got)
	}
	if n, err := m.Length(); err != nil || n != 40 {
		t.Fatalf("Length = %d, %v", n, err)
	}
	m.Chunks[1].ExpectedTokens = nil
	if _, err := m.Length(); err == nil {
		t.Fatal("image without expected_tokens has a length")
	}
}

// The golden vector of §T4.
func TestProtoGoldenVector(t *testing.T) {
	hexs := "0a160801120864000000c80000001a08000000bf0000a0bf0a0c1204070000001a04000000be" +
		"12080000c07f000060c01a280a1000000000000000000b0000000c0000001210804fc3c7804f" +
		"c3c7000000bf000000c0180220022003"
	b, err := hex.DecodeString(hexs)
	if err != nil || len(b) != 92 {
		t.Fatalf("vector: %d bytes, %v", len(b), err)
	}
	r, err := decodeSampleResponseProto(b)
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs := []SampledSequence{
		{StopReason: StopReasonLength, Tokens: []int{100, 200}, Logprobs: []float64{-0.5, -1.25}},
		{StopReason: StopReasonStop, Tokens: []int{7}, Logprobs: []float64{-0.125}},
	}
	if !reflect.DeepEqual(r.Sequences, wantSeqs) {
		t.Fatalf("sequences %+v", r.Sequences)
	}
	if len(r.PromptLogprobs) != 2 || !math.IsNaN(r.PromptLogprobs[0]) || r.PromptLogprobs[1] != -3.5 {
		t.Fatalf("prompt logprobs %v", r.PromptLogprobs)
	}
	wantTopK := [][]TokenLogprob{nil, {{11, -0.5}, {12, -2.0}}}
	if !reflect.DeepEqual(r.TopKPromptLogprobs, wantTopK) {
		t.Fatalf("topk %+v", r.TopKPromptLogprobs)
	}
	if r.PromptCacheHitTokens != 3 {
		t.Fatalf("cache hits %d", r.PromptCacheHitTokens)
	}
	// Our own test encoder agrees with the decoder.
	back, err := decodeSampleResponseProto(encodeResponse(&SampleResponse{Sequences: wantSeqs, PromptCacheHitTokens: 3}))
	if err != nil || !reflect.DeepEqual(back.Sequences, wantSeqs) {
		t.Fatalf("round trip %+v %v", back, err)
	}
}

func TestProtoDecodeErrors(t *testing.T) {
	cases := map[string]string{
		"unknown stop reason": "0a020802",
		"tokens not x4":       "0a03120101",
		"truncated":           "0a05",
		"logprob length":      "0a0e1204010000001a080000000000000000",
	}
	for name, h := range cases {
		b, _ := hex.DecodeString(h)
		if _, err := decodeSampleResponseProto(b); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	// 2^31 x 2^31 cells and none given: 4 bytes a cell overflow 64 bits to 0, which must not
	// pass for the empty lists' length (a 48 GiB allocation ended the process).
	if _, err := decodeSampleResponseProto(hugeTopK()); err == nil {
		t.Error("a top-k matrix of 2^62 cells with none given decoded without error")
	}
	// Empty logprobs mean none; unknown fields are skipped.
	b, _ := hex.DecodeString("0a0b12040100000018fa011a00" + "2805")
	r, err := decodeSampleResponseProto(b)
	if err != nil || r.Sequences[0].Logprobs != nil || r.Sequences[0].Tokens[0] != 1 {
		t.Fatalf("%+v %v", r, err)
	}
}

// The JSON shape of §T3.
func TestJSONSampleResponse(t *testing.T) {
	body := `{"type":"sample","sequences":[
	  {"stop_reason":"stop","tokens":[791,9282,374,14198,13],"logprobs":[-0.91,-0.02,-1.7,-0.33,-0.05]},
	  {"stop_reason":"length","tokens":[791,9282],"logprobs":null}],
	 "prompt_logprobs":[null,-3.2,-0.7],
	 "topk_prompt_logprobs":[null,[[872,-0.12],[9707,-2.5]],[[198,-0.01]]],
	 "prompt_cache_hit_tokens":4,"extra":1}`
	r, err := decodeSampleResponseJSON([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Sequences[0].StopReason != StopReasonStop || r.Sequences[1].StopReason != StopReasonLength ||
		r.Sequences[1].Logprobs != nil || len(r.Sequences[0].Logprobs) != 5 || r.PromptCacheHitTokens != 4 {
		t.Fatalf("%+v", r)
	}
	if !math.IsNaN(r.PromptLogprobs[0]) || r.PromptLogprobs[2] != -0.7 {
		t.Fatalf("prompt logprobs %v", r.PromptLogprobs)
	}
	want := [][]TokenLogprob{nil, {{872, -0.12}, {9707, -2.5}}, {{198, -0.01}}}
	if !reflect.DeepEqual(r.TopKPromptLogprobs, want) {
		t.Fatalf("topk %v", r.TopKPromptLogprobs)
	}
	if _, err := decodeSampleResponseJSON([]byte(`{"sequences":[{"stop_reason":"eos","tokens":[]}]}`)); err == nil {
		t.Fatal("unknown stop reason accepted")
	}
	// The service's text in an error (it ends in a job's result) is cut, however long.
	long := strings.Repeat("x", 1<<20)
	for _, body := range []string{`{"sequences":[{"stop_reason":"` + long + `","tokens":[]}]}`, `{"type":"` + long + `","sequences":[]}`} {
		if _, err := decodeSampleResponseJSON([]byte(body)); err == nil || len(err.Error()) > 200 {
			t.Fatalf("an unknown stop reason or type of 1 MiB: an error of %d bytes", len(fmt.Sprint(err)))
		}
	}
}

// Retry-After in its three forms (§6.1), and the 0 < d ≤ 60 s rule.
func TestRetryAfterParsing(t *testing.T) {
	now := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	h := func(kv ...string) http.Header {
		x := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			x.Set(kv[i], kv[i+1])
		}
		return x
	}
	cases := []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"ms", h("retry-after-ms", "1500"), 1500 * time.Millisecond, true},
		{"ms float", h("retry-after-ms", "250.5"), 250500 * time.Microsecond, true},
		{"ms wins over seconds", h("retry-after-ms", "100", "retry-after", "9"), 100 * time.Millisecond, true},
		{"seconds", h("retry-after", "3"), 3 * time.Second, true},
		{"float seconds", h("retry-after", "0.75"), 750 * time.Millisecond, true},
		{"http date", h("retry-after", now.Add(7*time.Second).Format(http.TimeFormat)), 7 * time.Second, true},
		{"rfc1123z date", h("retry-after", now.Add(4*time.Second).Format(time.RFC1123Z)), 4 * time.Second, true},
		{"too long", h("retry-after", "61"), 0, false},
		{"zero", h("retry-after", "0"), 0, false},
		{"past date", h("retry-after", now.Add(-time.Second).Format(http.TimeFormat)), 0, false},
		{"garbage", h("retry-after", "soon"), 0, false},
		{"absent", h(), 0, false},
	}
	for _, c := range cases {
		got, ok := retryAfter(c.h, now)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: got %v,%v want %v,%v", c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestBackoffFormulas(t *testing.T) {
	// §6.1: 0.5, 1, 2, 4, 8, 10, 10 s, reduced by up to 25 %.
	for n, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second} {
		if got := httpBackoff(n, 500*time.Millisecond, 10*time.Second, 0); got != want {
			t.Errorf("http n=%d u=0: %v want %v", n, got, want)
		}
		if got := httpBackoff(n, 500*time.Millisecond, 10*time.Second, 0.999999); got < want*3/4 || got > want {
			t.Errorf("http n=%d u≈1: %v outside [%v,%v]", n, got, want*3/4, want)
		}
	}
	// §6.2: 1, 2, 4, 8, 16, 30, 30 s.
	for a, want := range []time.Duration{1, 2, 4, 8, 16, 30, 30} {
		if got := submitBackoff(a, time.Second, 30*time.Second); got != want*time.Second {
			t.Errorf("submit attempt %d: %v", a, got)
		}
	}
	// §6.3: min(0.5·2^k, 10) ± 25 %, clamped to 10 s.
	for k, base := range []float64{0.5, 1, 2, 4, 8, 10, 10} {
		lo := sampleBackoff(k, 500*time.Millisecond, 10*time.Second, 0.25, 0)
		mid := sampleBackoff(k, 500*time.Millisecond, 10*time.Second, 0.25, 0.5)
		hi := sampleBackoff(k, 500*time.Millisecond, 10*time.Second, 0.25, 0.99999)
		b := time.Duration(base * float64(time.Second))
		if mid != b || lo != b*3/4 || hi > 10*time.Second || hi < b {
			t.Errorf("sample k=%d: lo %v mid %v hi %v (base %v)", k, lo, mid, hi, b)
		}
	}
}

func TestAPIKeyRedaction(t *testing.T) {
	k := testKey
	secret := "TESTSECRET"
	outs := []string{
		k.String(), fmt.Sprint(k), fmt.Sprintf("%v %s %q %+v %#v %x %d", k, k, k, k, k, k, k),
		fmt.Sprintf("%v", struct{ K APIKey }{k}), fmt.Sprintf("%#v", Config{APIKey: k}),
		fmt.Sprintf("%+v", Config{APIKey: k}),
	}
	jb, _ := json.Marshal(struct{ Key APIKey }{k})
	outs = append(outs, string(jb))
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "key", k, "any", any(k))
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "key", k)
	outs = append(outs, buf.String())
	for _, o := range outs {
		if strings.Contains(o, secret) {
			t.Fatalf("key leaked: %s", o)
		}
	}
	if !strings.Contains(k.String(), "tml-") || !strings.Contains(k.String(), redactedText) {
		t.Fatalf("redacted form %q", k.String())
	}
	if err := APIKey("sk-TESTSECRET").Validate(); err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("validate: %v", err)
	}
}

func TestAPIKeyFrom(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "key")
	if err := os.WriteFile(file, []byte("  tml-FROMFILE\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if k, err := APIKeyFrom(env(map[string]string{"TINKER_API_KEY": "tml-ENV", "TINKER_API_KEY_FILE": file})); err != nil || k != "tml-ENV" {
		t.Fatalf("env: %v %v", string(k), err)
	}
	if k, err := APIKeyFrom(env(map[string]string{"TINKER_API_KEY_FILE": file})); err != nil || k != "tml-FROMFILE" {
		t.Fatalf("file: %v %v", string(k), err)
	}
	if err := os.WriteFile(file, []byte("bogus-SECRETVALUE"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := APIKeyFrom(env(map[string]string{"TINKER_API_KEY_FILE": file})); err == nil || strings.Contains(err.Error(), "SECRETVALUE") {
		t.Fatalf("bad file key: %v", err)
	}
	if _, err := APIKeyFrom(env(nil)); err == nil {
		t.Fatal("no key accepted")
	}
	// A file far larger than a credential is not read whole.
	if err := os.WriteFile(file, []byte("tml-"+strings.Repeat("x", 100<<10)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := APIKeyFromFile(file); err == nil || !strings.Contains(err.Error(), "not a credential") || strings.Contains(err.Error(), "xxxx") {
		t.Fatalf("a 100 KiB key file: %v", err)
	}
	// The file is the key's source only when TINKER_API_KEY says nothing.
	if got := APIKeyFileOf(env(map[string]string{"TINKER_API_KEY_FILE": file})); got != file {
		t.Fatalf("APIKeyFileOf = %q", got)
	}
	if got := APIKeyFileOf(env(map[string]string{"TINKER_API_KEY": "tml-ENV", "TINKER_API_KEY_FILE": file})); got != "" {
		t.Fatalf("APIKeyFileOf with TINKER_API_KEY set = %q", got)
	}
	t.Setenv("TINKER_API_KEY", "eyJhbGciOi.x.y")
	t.Setenv("TINKER_API_KEY_FILE", "")
	t.Setenv("TINKER_CREDENTIAL_CMD", "")
	if k, cmd, err := CredentialsFrom(os.Getenv); err != nil || k != "eyJhbGciOi.x.y" || cmd != "" {
		t.Fatalf("CredentialsFrom(os.Getenv): %q %v", cmd, err)
	}
}

// hugeTopK is a response whose top-k prompt logprobs say 2^31 rows of 2^31 and give no cell.
func hugeTopK() []byte {
	var topk []byte
	topk = protowire.AppendVarint(protowire.AppendTag(topk, fieldTopKK, protowire.VarintType), 1<<31)
	topk = protowire.AppendVarint(protowire.AppendTag(topk, fieldTopKPromptLength, protowire.VarintType), 1<<31)
	return protowire.AppendBytes(protowire.AppendTag(nil, fieldRespTopK, protowire.BytesType), topk)
}

// TestAKeyFileOfTwoLinesIsRefused: a key file holding two keys (a rotation appended to the
// mounted secret) or a control character is refused, without quoting the key. It passed
// Validate, and every request then failed inside net/http ("invalid header field value for
// X-Api-Key"), which the client retried as a connection error (§6.2) for minutes.
func TestAKeyFileOfTwoLinesIsRefused(t *testing.T) {
	for _, content := range []string{"tml-aaa\ntml-bbb\n", "tml-aa\x01a\n"} {
		path := t.TempDir() + "/key"
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		k, err := APIKeyFromFile(path)
		if err == nil {
			t.Errorf("key file %q accepted as %q", content, string(k))
		} else if strings.Contains(err.Error(), "aaa") {
			t.Errorf("error quotes the key: %v", err)
		}
	}
}

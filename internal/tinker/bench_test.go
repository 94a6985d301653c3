package tinker

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// benchServer is a minimal fast Tinker peer: asample answers a fixed future,
// retrieve_future a fixed protobuf result (64 tokens with logprobs).
func benchServer(b *testing.B) *httptest.Server {
	b.Helper()
	toks := make([]int, 64)
	lps := make([]float64, 64)
	for i := range toks {
		toks[i], lps[i] = 1000+i, -0.5
	}
	result := encodeResponse(&SampleResponse{Sequences: []SampledSequence{{StopReason: StopReasonStop, Tokens: toks, Logprobs: lps}}})
	fut := []byte(`{"request_id":"s:sample:0:1"}`)
	resultLen, futLen := strconv.Itoa(len(result)), strconv.Itoa(len(fut))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch {
		case strings.HasSuffix(r.URL.Path, "/asample"):
			w.Header()["Content-Type"] = []string{"application/json"}
			w.Header()["Content-Length"] = []string{futLen}
			_, _ = w.Write(fut)
		case strings.HasSuffix(r.URL.Path, "/retrieve_future"):
			w.Header()["Content-Type"] = []string{"application/x-protobuf"}
			w.Header()["Content-Length"] = []string{resultLen}
			_, _ = w.Write(result)
		case strings.HasSuffix(r.URL.Path, "/create_session"):
			_, _ = w.Write([]byte(`{"session_id":"s"}`))
		case strings.HasSuffix(r.URL.Path, "/create_sampling_session"):
			_, _ = w.Write([]byte(`{"sampling_session_id":"s:sample:0"}`))
		case strings.HasSuffix(r.URL.Path, "/client/config"):
			_, _ = w.Write([]byte(`{}`))
		default:
			http.NotFound(w, r)
		}
	}))
	b.Cleanup(srv.Close)
	return srv
}

func benchRequest() SampleRequest {
	toks := make([]int, 200)
	for i := range toks {
		toks[i] = 100000 + i
	}
	mt := 64
	return SampleRequest{Prompt: EncodedText(toks), Params: SamplingParams{MaxTokens: &mt}}
}

// BenchmarkSampleRoundTrip is one full Sample (asample + one poll + protobuf
// decode) over loopback HTTP; the server's own cost is included (see
// BenchmarkRawHTTPBaseline for the same two requests without the client).
func BenchmarkSampleRoundTrip(b *testing.B) {
	srv := benchServer(b)
	c, err := Dial(context.Background(), Config{BaseURL: srv.URL, APIKey: testKey})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSampler(context.Background(), SamplerSpec{BaseModel: "m"})
	if err != nil {
		b.Fatal(err)
	}
	req := benchRequest()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.Sample(ctx, req)
		if err != nil || len(res.Response.Sequences[0].Tokens) != 64 {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawHTTPBaseline sends the same two requests with a bare http.Client,
// to subtract loopback HTTP and server cost from BenchmarkSampleRoundTrip.
func BenchmarkRawHTTPBaseline(b *testing.B) {
	srv := benchServer(b)
	hc := &http.Client{Transport: defaultTransport(nil)}
	req := benchRequest()
	body, _ := appendSampleRequest(nil, &req, "s:sample:0", 1)
	poll := pollBody("s:sample:0:1", true)
	do := func(path string, body []byte) {
		r, err := hc.Post(srv.URL+path, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	b.ReportAllocs()
	for b.Loop() {
		do("/api/v1/asample", body)
		do("/api/v1/retrieve_future", poll)
	}
}

func BenchmarkEncodeSampleRequest(b *testing.B) {
	req := benchRequest()
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = appendSampleRequest(buf[:0], &req, "s:sample:0", 123456789); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeSampleResponseProto(b *testing.B) {
	toks := make([]int, 256)
	lps := make([]float64, 256)
	msg := encodeResponse(&SampleResponse{Sequences: []SampledSequence{{Tokens: toks, Logprobs: lps}, {Tokens: toks, Logprobs: lps}}})
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeSampleResponseProto(msg); err != nil {
			b.Fatal(err)
		}
	}
}

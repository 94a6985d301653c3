package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

// genLine returns a realistic job line; the kind rotates with i.
func genLine(i int) string {
	switch i % 4 {
	case 0:
		return fmt.Sprintf(`{"custom_id": "job-%08d", "model": "Qwen/Qwen3-8B", "messages": [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": "Summarise document number %d in three sentences, focusing on the key findings."}], "sampling_params": {"max_tokens": 256, "temperature": 0.7, "top_p": 0.95, "seed": %d}, "metadata": {"doc": %d, "split": "train"}}`, i, i, i, i)
	case 1:
		return fmt.Sprintf(`{"custom_id": "job-%08d", "model": "Qwen/Qwen3-8B", "prompt": "The following is a short story about item %d:\n", "sampling_params": {"max_tokens": 128, "stop": ["\n\n"]}, "num_samples": 4}`, i, i)
	case 2:
		return fmt.Sprintf(`{"custom_id": "job-%08d", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "Question %d: what is the capital of France?"}], "max_tokens": 64, "temperature": 0}}`, i, i)
	default:
		return fmt.Sprintf(`{"custom_id": "job-%08d", "model": "Qwen/Qwen3-8B", "prompt_tokens": [151644, 872, 198, 3838, 374, 279, 6722, 315, 9625, 30, 151645, 198, 151644, 77091, 198, %d], "sampling_params": {"max_tokens": 32, "stop": [151645]}}`, i, i%150000)
	}
}

// BenchmarkReaderNext measures Reader.Next on a mix of native and OpenAI lines (about 250 bytes
// each). One op is one line; a fresh Reader is started every 100k lines.
func BenchmarkReaderNext(b *testing.B) {
	const lines = 100000
	var buf bytes.Buffer
	for i := range lines {
		buf.WriteString(genLine(i))
		buf.WriteByte('\n')
	}
	data := buf.Bytes()
	b.SetBytes(int64(len(data) / lines))
	b.ReportAllocs()
	b.ResetTimer()
	var r *Reader
	for i := 0; i < b.N; i++ {
		if i%lines == 0 {
			r = NewReader(bytes.NewReader(data), "bench.jsonl", Limits{})
		}
		if _, err := r.Next(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkIDSet compares the memory of the hash+arena set with a plain map[string]int for 1M
// ids of 12 bytes (reported as B/id, retained heap after GC).
func BenchmarkIDSet(b *testing.B) {
	const n = 1_000_000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("job-%08d", i)
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	b.Run("hash-arena", func(b *testing.B) {
		for b.Loop() {
			before := heap()
			s := newIDSet()
			for i, id := range ids {
				s.add(id, i+1)
			}
			b.ReportMetric(float64(heap()-before)/n, "B/id")
			runtime.KeepAlive(&s)
		}
	})
	b.Run("string-map", func(b *testing.B) {
		for b.Loop() {
			before := heap()
			m := make(map[string]int)
			for i, id := range ids {
				// Copy the id as the reader would (its bytes come from a reused buffer).
				m[string([]byte(id))] = i + 1
			}
			b.ReportMetric(float64(heap()-before)/n, "B/id")
			runtime.KeepAlive(m)
		}
	})
}

// BenchmarkValidJSON compares the syntax check every line and job goes through with
// encoding/json's, on the lines of BenchmarkReaderNext. One op is one line.
func BenchmarkValidJSON(b *testing.B) {
	lines := make([][]byte, 64)
	for i := range lines {
		lines[i] = []byte(genLine(i))
	}
	for _, c := range []struct {
		name  string
		valid func([]byte) bool
	}{{"validJSON", validJSON}, {"encoding-json", json.Valid}} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if !c.valid(lines[i%len(lines)]) {
					b.Fatal("a valid line judged invalid")
				}
			}
		})
	}
}

// BenchmarkWorkerCodec measures what a worker does to each job's bytes besides sampling:
// decoding the encoded job (syntax check and parse) and encoding its result with 16 sampled
// tokens and their logprobs, as in bench comparison 2. One op is one job.
func BenchmarkWorkerCodec(b *testing.B) {
	mt := 16
	jobs := make([][]byte, 64)
	for i := range jobs {
		j := Job{CustomID: fmt.Sprintf("job-%08d", i), Model: "Qwen/Qwen3-8B", NumSamples: 1,
			Prompt: fmt.Sprintf("Question %d: explain in %d words why the sky is blue at noon and red at dusk.", i, 10+i%50),
			Params: SamplingParams{MaxTokens: &mt}}
		data, err := j.Encode()
		if err != nil {
			b.Fatal(err)
		}
		jobs[i] = data
	}
	b.Run("decode-job", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := DecodeJob(jobs[i%len(jobs)]); err != nil {
				b.Fatal(err)
			}
		}
	})
	res := Result{CustomID: "job-00000042", BatchID: "batch-2026-11-23", Status: StatusOK, Model: "Qwen/Qwen3-8B",
		Samples: []Sample{{Text: " The sky looks blue at noon because air scatters short wavelengths", StopReason: StopReasonLength}},
		Usage:   &Usage{PromptTokens: 24, CompletionTokens: mt}, Attempts: 1, LatencyMS: 812}
	for k := range mt {
		res.Samples[0].Tokens = append(res.Samples[0].Tokens, 1000+k*7919%150000)
		res.Samples[0].Logprobs = append(res.Samples[0].Logprobs, float64(float32(-0.01-float64(k)*0.37)))
	}
	b.Run("encode-result", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			var err error
			if buf, err = res.AppendJSON(buf[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLongResult measures writing the result of a long sample: 1,000 tokens, their
// logprobs (float32 values of -Exp(1)) and a text of 5,000 bytes. One op is one result.
// Writing the logprobs took about four fifths of it with strconv (43 µs of 54, measured with a
// like benchmark); with internal/ftoa the whole takes 0.62 of the instructions it did.
func BenchmarkLongResult(b *testing.B) {
	const n = 1000
	rng := rand.New(rand.NewPCG(7, 8))
	sample := Sample{StopReason: StopReasonLength, Text: strings.Repeat(" word", n)}
	for range n {
		sample.Tokens = append(sample.Tokens, rng.IntN(150000))
		sample.Logprobs = append(sample.Logprobs, float64(float32(-rng.ExpFloat64())))
	}
	res := Result{CustomID: "job-00000042", BatchID: "batch-2026-11-30", Status: StatusOK, Model: "Qwen/Qwen3-8B",
		Samples: []Sample{sample}, Usage: &Usage{PromptTokens: 24, CompletionTokens: n}, Attempts: 1, LatencyMS: 812}
	buf := make([]byte, 0, 64<<10)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = res.AppendJSON(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

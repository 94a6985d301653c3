package tinkersim

import (
	"testing"
)

func BenchmarkAppendProto(b *testing.B) {
	g := generator{minGen: 1, tokenMin: 1000, tokenMax: 100000, stopProb: 0.05}
	resp := g.generate(&genParams{prompt: make([]int32, 512), numSamples: 4, maxTokens: 256, promptLP: true, topK: 5})
	buf := make([]byte, 0, 1<<16)
	b.ReportAllocs()
	for b.Loop() {
		buf = resp.AppendProto(buf[:0])
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkGenerate(b *testing.B) {
	g := generator{minGen: 1, tokenMin: 1000, tokenMax: 100000, stopProb: 0.05}
	p := &genParams{prompt: make([]int32, 512), numSamples: 1, maxTokens: 256, stopTokens: []int32{151645}}
	b.ReportAllocs()
	for b.Loop() {
		p.seed++
		g.generate(p)
	}
}

// BenchmarkSampleRoundTrip is one asample plus one protobuf poll over loopback HTTP.
func BenchmarkSampleRoundTrip(b *testing.B) {
	h := newHarness(b, Config{Capacity: 1 << 20})
	ssid := h.sampler("Qwen/Qwen3-8B")
	b.ReportAllocs()
	seq := int64(0)
	for b.Loop() {
		seq++
		id := h.asample(sampleBody(ssid, seq, []int32{1, 2, 3, 4}, map[string]any{"max_tokens": 32}))
		h.protoResult(id)
	}
}

// BenchmarkTopKLongPrompt is the top-k table of a 32k-token prompt: a request that scores a
// long document (prompt logprobs, k = 20).
func BenchmarkTopKLongPrompt(b *testing.B) {
	g := generator{minGen: 1, tokenMin: 1000, tokenMax: 100000, stopProb: 0.05}
	prompt := make([]int32, 32768)
	for i := range prompt {
		prompt[i] = int32(i * 7919 % 150000)
	}
	b.ReportAllocs()
	for b.Loop() {
		g.topK(prompt, MaxTopK)
	}
}

package tokenizer

import (
	"strings"
	"sync/atomic"
	"testing"
)

const benchSize = 1 << 20

func benchEncode(b *testing.B, tok *Tokenizer) {
	corpus := buildCorpus(b, benchSize)
	n := len(tok.Encode(corpus)) // warms the piece cache as a long-running worker would be
	b.SetBytes(int64(len(corpus)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		tok.Encode(corpus)
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

func benchEncodeParallel(b *testing.B, tok *Tokenizer) {
	corpus := buildCorpus(b, benchSize)
	n := len(tok.Encode(corpus))
	b.SetBytes(int64(len(corpus)))
	b.ReportAllocs()
	var runs atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tok.Encode(corpus)
			runs.Add(1)
		}
	})
	b.ReportMetric(float64(n)*float64(runs.Load())/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkEncodeQwen3 encodes a 1 MB mix of prose, Go source, CJK, emoji and numbers.
func BenchmarkEncodeQwen3(b *testing.B) { benchEncode(b, qwen3(b)) }

// BenchmarkClassifySymbols classifies text of the characters Go's tables call other (CJK
// punctuation, emoji, arrows), each of which the scanners also look up in newerCategories.
func BenchmarkClassifySymbols(b *testing.B) {
	text := strings.Repeat("好。「对」、…🚀👍→★ ok ", 2000)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		for i := 0; i < len(text); {
			_, w := classAt(text, i)
			i += w
		}
	}
}

// BenchmarkEncodeQwen3Parallel shares one tokenizer between GOMAXPROCS goroutines.
func BenchmarkEncodeQwen3Parallel(b *testing.B) { benchEncodeParallel(b, qwen3(b)) }

// BenchmarkEncodeQwen3Cold measures a tokenizer whose piece cache is empty.
func BenchmarkEncodeQwen3Cold(b *testing.B) {
	tok := qwen3(b)
	corpus := buildCorpus(b, benchSize)
	b.SetBytes(int64(len(corpus)))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		c := *tok
		m := *tok.model
		m.cache = newPieceCache(16)
		c.model = &m
		n += len(c.Encode(corpus))
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkEncodeLlama3 is BenchmarkEncodeQwen3 for Llama 3 (needs TINKERFLEET_LLAMA3_TOKENIZER).
func BenchmarkEncodeLlama3(b *testing.B) { benchEncode(b, llama3(b)) }

// BenchmarkEncodeLlama3Parallel is the parallel variant for Llama 3.
func BenchmarkEncodeLlama3Parallel(b *testing.B) { benchEncodeParallel(b, llama3(b)) }

// BenchmarkDecodeQwen3 decodes the ids of the 1 MB corpus.
func BenchmarkDecodeQwen3(b *testing.B) {
	tok := qwen3(b)
	ids := tok.Encode(buildCorpus(b, benchSize))
	b.ReportAllocs()
	for b.Loop() {
		tok.Decode(ids)
	}
	b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkParseQwen3 is the start-up cost of a worker or submit: decompressing and parsing
// the built-in Qwen3 tokenizer.json.
func BenchmarkParseQwen3(b *testing.B) {
	data := qwen3JSON(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeGptOss is BenchmarkEncodeQwen3 with gpt-oss's o200k tokenizer, and
// BenchmarkEncodeGptOssRegexp2 the same with its pattern run by regexp2 instead of the
// hand-written scanner (the baseline: how gpt-oss was tokenized before the scanner).
func BenchmarkEncodeGptOss(b *testing.B) { benchEncode(b, gptOss(b)) }

func BenchmarkEncodeGptOssRegexp2(b *testing.B) {
	benchEncode(b, withRegexSplitter(b, gptOss(b), PatternO200k))
}

// BenchmarkEncodeDeepSeekV3 encodes the 1 MB text with DeepSeek V3's three chained Split
// patterns, cut by hand; BenchmarkEncodeDeepSeekV3Regexp2 with regexp2, the fallback.
func BenchmarkEncodeDeepSeekV3(b *testing.B) { benchEncode(b, deepseekV3(b)) }

func BenchmarkEncodeDeepSeekV3Regexp2(b *testing.B) {
	benchEncode(b, withRegexSplitters(b, deepseekV3(b), PatternDeepSeekDigits, PatternDeepSeekCJK, PatternDeepSeekWords))
}

package tinkersim

import (
	"math"
)

// The generator is the simulator's "model": a pure function of the prompt tokens, the seed,
// the sample index and a few Config knobs, so that the same request always yields the same
// tokens (on any server instance), whatever the timing or the order of requests.
//
// Rules (documented in doc.go):
//   - a target length L is drawn uniformly in [min(MinGenTokens, max_tokens), max_tokens];
//   - each token is drawn uniformly in [TokenMin, TokenMax);
//   - with stop token ids, each position independently emits one of them with probability
//     StopTokenProbability; a generated token that is a stop id ends the sequence (stop reason
//     "stop", the stop id is the last returned token); if the natural end L < max_tokens comes
//     first, the last token is replaced by a stop id;
//   - with stop strings, or no stop at all, the natural end L < max_tokens is a "stop" (the
//     matched stop string, or the model's end-of-sequence token, is not returned); the text of
//     generated tokens never matches a stop string otherwise;
//   - reaching max_tokens is a "length".

// genParams is the part of a request that determines the output.
type genParams struct {
	prompt     []int32
	seed       uint64
	numSamples int
	maxTokens  int
	stopTokens []int32
	promptLP   bool
	topK       int
}

// generator holds the Config knobs of the generator.
type generator struct {
	minGen   int
	tokenMin int32
	tokenMax int32
	stopProb float64
}

// splitmix64 is a tiny, well-mixed, stable PRNG (the exact outputs are part of the
// simulator's determinism contract, so math/rand is not used here).
type splitmix64 uint64

func (s *splitmix64) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float returns a value in [0, 1).
func (s *splitmix64) float() float64 { return float64(s.next()>>11) / (1 << 53) }

// fnvOffset is the FNV-1a hash of no tokens.
const fnvOffset = uint64(14695981039346656037)

// hashPrompt is FNV-1a over the token ids' little-endian bytes.
func hashPrompt(tokens []int32) uint64 {
	h := fnvOffset
	for _, t := range tokens {
		h = hashToken(h, t)
	}
	return h
}

// hashToken extends h, the FNV-1a hash of some tokens, by one more token, so that the hashes
// of every prefix of a prompt cost one pass over it.
func hashToken(h uint64, t int32) uint64 {
	v := uint32(t)
	for i := 0; i < 4; i++ {
		h ^= uint64(byte(v >> (8 * i)))
		h *= 1099511628211
	}
	return h
}

// logprobFrom maps random bits to a logprob in (-8, 0], a multiple of 1/1024 (exact in float32,
// short in JSON).
func logprobFrom(r uint64) float32 {
	return -float32(r%8192) / 1024
}

// generate produces the SampleResponse for p.
func (g *generator) generate(p *genParams) *SampleResponse {
	ph := hashPrompt(p.prompt)
	resp := &SampleResponse{Sequences: make([]Sequence, p.numSamples)}
	stopSet := make(map[int32]struct{}, len(p.stopTokens))
	for _, t := range p.stopTokens {
		stopSet[t] = struct{}{}
	}
	span := int64(g.tokenMax) - int64(g.tokenMin)
	for i := range resp.Sequences {
		rng := splitmix64(ph ^ (p.seed * 0x9e3779b97f4a7c15) ^ (uint64(i+1) * 0xd1b54a32d192ed03))
		rng.next()
		lo := min(g.minGen, p.maxTokens)
		target := lo + int(rng.next()%uint64(p.maxTokens-lo+1))
		seq := Sequence{StopReason: StopReasonLength, Tokens: make([]int32, 0, target), Logprobs: make([]float32, 0, target)}
		for pos := 0; pos < target; pos++ {
			tok := int32(int64(g.tokenMin) + int64(rng.next()%uint64(span)))
			if len(p.stopTokens) > 0 && (rng.float() < g.stopProb || (pos == target-1 && target < p.maxTokens)) {
				tok = p.stopTokens[rng.next()%uint64(len(p.stopTokens))]
			}
			seq.Tokens = append(seq.Tokens, tok)
			seq.Logprobs = append(seq.Logprobs, logprobFrom(rng.next()))
			if _, ok := stopSet[tok]; ok {
				seq.StopReason = StopReasonStop
				break
			}
		}
		if len(seq.Tokens) < p.maxTokens {
			seq.StopReason = StopReasonStop
		}
		resp.Sequences[i] = seq
	}
	if p.promptLP {
		resp.PromptLogprobs = make([]float32, len(p.prompt))
		resp.PromptLogprobs[0] = float32(math.NaN())
		for i := 1; i < len(p.prompt); i++ {
			resp.PromptLogprobs[i] = promptLogprob(p.prompt[i-1], p.prompt[i], i)
		}
	}
	if p.topK > 0 {
		resp.TopK = g.topK(p.prompt, p.topK)
	}
	return resp
}

// promptLogprob is the deterministic logprob of prompt token cur after prev at position pos.
func promptLogprob(prev, cur int32, pos int) float32 {
	r := splitmix64(uint64(uint32(prev))<<32 | uint64(uint32(cur)) ^ uint64(pos)*0x632be59bd9b4e019)
	return logprobFrom(r.next())
}

// topK builds the dense top-k table: row 0 empty (no logprob for the first position), row i
// holds k distinct consecutive token ids (k is capped by the token range) with strictly
// decreasing logprobs, drawn from the hash of the prompt up to and including position i. The
// hashes of the prefixes are one running hash: hashing each prefix anew took 2.4 s for a 32k
// token prompt, on the request's goroutine, before asample answered.
func (g *generator) topK(prompt []int32, k int) *TopKPromptLogprobs {
	span := int64(g.tokenMax) - int64(g.tokenMin)
	if int64(k) > span {
		k = int(span)
	}
	n := len(prompt)
	t := &TopKPromptLogprobs{K: uint32(k), PromptLength: uint32(n), TokenIDs: make([]int32, n*k), Logprobs: make([]float32, n*k)}
	for j := 0; j < k; j++ {
		t.Logprobs[j] = topkEmptyLogprob
	}
	h := fnvOffset
	if n > 0 {
		h = hashToken(h, prompt[0])
	}
	for i := 1; i < n; i++ {
		h = hashToken(h, prompt[i]) // hashPrompt(prompt[:i+1])
		r := splitmix64(h)
		base := int64(r.next() % uint64(span))
		best := -float32(r.next()%512) / 1024 // in (-0.5, 0]
		for j := 0; j < k; j++ {
			t.TokenIDs[i*k+j] = int32(int64(g.tokenMin) + (base+int64(j))%span)
			t.Logprobs[i*k+j] = best - float32(j)*0.25
		}
	}
	return t
}

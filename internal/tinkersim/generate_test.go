package tinkersim

import (
	"slices"
	"testing"
)

// TestTopKRowFollowsThePromptUpToIt pins the top-k table to its definition: row i is drawn
// from the hash of the prompt up to and including token i, so it changes with any of those
// tokens and with none after them. The outputs are part of the determinism contract, so the
// rows are checked against that hash itself, not only against each other.
func TestTopKRowFollowsThePromptUpToIt(t *testing.T) {
	t.Parallel()
	g := generator{minGen: 1, tokenMin: 1000, tokenMax: 100000}
	const k = 3
	prompt := make([]int32, 300)
	for i := range prompt {
		prompt[i] = int32(i*7919%150000) - 20 // some ids negative: every byte of a token counts
	}
	row := func(tk *TopKPromptLogprobs, i int) ([]int32, []float32) {
		return tk.TokenIDs[i*k : (i+1)*k], tk.Logprobs[i*k : (i+1)*k]
	}

	tk := g.topK(prompt, k)
	span := uint64(g.tokenMax - g.tokenMin)
	for i := 1; i < len(prompt); i++ {
		r := splitmix64(hashPrompt(prompt[:i+1]))
		wantID := g.tokenMin + int32(r.next()%span)
		wantLP := -float32(r.next()%512) / 1024
		ids, lps := row(tk, i)
		if ids[0] != wantID || lps[0] != wantLP {
			t.Fatalf("row %d starts with %d %v, want %d %v (from the hash of prompt[:%d])", i, ids[0], lps[0], wantID, wantLP, i+1)
		}
	}

	const changed = 150
	other := slices.Clone(prompt)
	other[changed]++
	tk2 := g.topK(other, k)
	for i := 1; i < len(prompt); i++ {
		ids, lps := row(tk, i)
		ids2, lps2 := row(tk2, i)
		same := slices.Equal(ids, ids2) && slices.Equal(lps, lps2)
		if same != (i < changed) {
			t.Fatalf("row %d same=%v after token %d changed", i, same, changed)
		}
	}
}

package tinker

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// FuzzDecodeSampleResponse: whatever a service sends as a sample's result, decoding it
// returns an error or a response whose parts agree (logprobs, when given, one per token),
// and never panics: a panic here would end the job's worker.
func FuzzDecodeSampleResponse(f *testing.F) {
	// A sequence of two tokens with their logprobs, a prompt logprob, a 1x1 top-k matrix.
	var seq, topk, resp []byte
	seq = protowire.AppendVarint(protowire.AppendTag(seq, fieldSeqStopReason, protowire.VarintType), 1)
	seq = protowire.AppendBytes(protowire.AppendTag(seq, fieldSeqTokens, protowire.BytesType), []byte{9, 0, 0, 0, 7, 0, 0, 0})
	seq = protowire.AppendBytes(protowire.AppendTag(seq, fieldSeqLogprobs, protowire.BytesType), []byte{0, 0, 0x80, 0xbf, 0, 0, 0, 0xc0})
	topk = protowire.AppendBytes(protowire.AppendTag(topk, fieldTopKTokenIDs, protowire.BytesType), []byte{5, 0, 0, 0})
	topk = protowire.AppendBytes(protowire.AppendTag(topk, fieldTopKLogprobs, protowire.BytesType), []byte{0, 0, 0x80, 0xbf})
	topk = protowire.AppendVarint(protowire.AppendTag(topk, fieldTopKK, protowire.VarintType), 1)
	topk = protowire.AppendVarint(protowire.AppendTag(topk, fieldTopKPromptLength, protowire.VarintType), 1)
	resp = protowire.AppendBytes(protowire.AppendTag(resp, fieldRespSequences, protowire.BytesType), seq)
	resp = protowire.AppendBytes(protowire.AppendTag(resp, fieldRespPromptLogprobs, protowire.BytesType), []byte{0, 0, 0x80, 0xbf})
	resp = protowire.AppendBytes(protowire.AppendTag(resp, fieldRespTopK, protowire.BytesType), topk)
	if _, err := decodeSampleResponseProto(resp); err != nil {
		f.Fatalf("the protobuf seed: %v", err)
	}
	f.Add(resp)
	// The same with one logprob for two tokens, in both forms: an error, not a response.
	var short []byte
	short = protowire.AppendBytes(protowire.AppendTag(short, fieldSeqTokens, protowire.BytesType), []byte{9, 0, 0, 0, 7, 0, 0, 0})
	short = protowire.AppendBytes(protowire.AppendTag(short, fieldSeqLogprobs, protowire.BytesType), []byte{0, 0, 0x80, 0xbf})
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, fieldRespSequences, protowire.BytesType), short))
	f.Add(hugeTopK())
	f.Add([]byte(`{"type":"sample","sequences":[{"stop_reason":"stop","tokens":[1,2],"logprobs":[-0.1]}]}`))
	f.Add([]byte(`{"type":"sample","sequences":[{"stop_reason":"stop","tokens":[1,2],"logprobs":[-0.1,-0.2]}],` +
		`"prompt_logprobs":[null,-1.5],"topk_prompt_logprobs":[null,[[7,-0.5],[8,-1]]]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for name, decode := range map[string]func([]byte) (*SampleResponse, error){
			"protobuf": decodeSampleResponseProto, "JSON": decodeSampleResponseJSON,
		} {
			r, err := decode(b)
			if err != nil {
				continue
			}
			for i, s := range r.Sequences {
				if len(s.Logprobs) != 0 && len(s.Logprobs) != len(s.Tokens) {
					t.Fatalf("%s: sequence %d has %d logprobs for %d tokens", name, i, len(s.Logprobs), len(s.Tokens))
				}
			}
		}
	})
}

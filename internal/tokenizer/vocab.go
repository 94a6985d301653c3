package tokenizer

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/bits"
)

// The two tables below hold a vocabulary without a pointer per token. A map[string]int32 and
// a []string of 150,000 tokens are 150,000 strings that the garbage collector marks, and
// pointers it scans, on every cycle for as long as the tokenizer lives: in a worker, work
// that grows with the vocabulary and not with the samples. These are a few pointer-free
// arrays, which it marks and never scans.

// tokenBytes holds each id's bytes back to back in one buffer.
type tokenBytes struct {
	buf  []byte
	ends []uint32 // ends[id] is where id's bytes end in buf; they start at ends[id-1] (0 for id 0)
}

// add appends the bytes of the next id.
func (t *tokenBytes) add(b []byte) {
	t.buf = append(t.buf, b...)
	t.ends = append(t.ends, uint32(len(t.buf)))
}

// len is one more than the largest id.
func (t *tokenBytes) len() int { return len(t.ends) }

// get returns id's bytes; none for an id without a token or out of range.
func (t *tokenBytes) get(id int) []byte {
	if id < 0 || id >= len(t.ends) {
		return nil
	}
	start := uint32(0)
	if id > 0 {
		start = t.ends[id-1]
	}
	return t.buf[start:t.ends[id]]
}

// vocab finds a token's id by its bytes: open addressing with linear probing over a table of
// slots, each the top 32 bits of its token's hash and, below them, one more than the offset
// of its entry in buf (0: empty). An entry is the token's length as a uvarint, its id (4
// bytes, little-endian) and its bytes. The hash bits let a probe pass over other tokens
// without reading their entries.
type vocab struct {
	seed  maphash.Seed
	slots []uint64 // a power of two long, at most 2/3 full
	buf   []byte
}

// tokenList is a vocabulary as tokenizer.json lists it: the i-th token's bytes (tokenBytes
// indexed by position, not id) and its id.
type tokenList struct {
	tokenBytes
	ids []int32
}

// add appends a token.
func (l *tokenList) add(b []byte, id int32) {
	l.tokenBytes.add(b)
	l.ids = append(l.ids, id)
}

// newVocab indexes tokens (bytes → id). Two tokens with the same bytes are an error, not a
// guess at the one HF keeps; no real tokenizer.json has any.
func newVocab(tokens *tokenList) (*vocab, error) {
	n := len(tokens.ids)
	size := 1 << bits.Len(uint(n+n/2)) // load ≤ 2/3
	v := &vocab{seed: maphash.MakeSeed(), slots: make([]uint64, size)}
	v.buf = make([]byte, 0, n*(binary.MaxVarintLen32+4)+len(tokens.buf))
	for i, id := range tokens.ids {
		s := tokens.get(i)
		if _, dup := v.id(string(s)); dup {
			return nil, fmt.Errorf("token %q appears more than once", s)
		}
		h := maphash.Bytes(v.seed, s)
		slot := h & uint64(len(v.slots)-1)
		for v.slots[slot] != 0 {
			slot = (slot + 1) & uint64(len(v.slots)-1)
		}
		v.slots[slot] = h>>32<<32 | uint64(len(v.buf)+1)
		v.buf = binary.AppendUvarint(v.buf, uint64(len(s)))
		v.buf = binary.LittleEndian.AppendUint32(v.buf, uint32(id))
		v.buf = append(v.buf, s...)
	}
	return v, nil
}

// id returns the id of the token whose bytes are s.
func (v *vocab) id(s string) (int32, bool) {
	h := maphash.String(v.seed, s)
	mask := uint64(len(v.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		slot := v.slots[i]
		if slot == 0 {
			return 0, false
		}
		if slot>>32 != h>>32 {
			continue
		}
		e := v.buf[uint32(slot)-1:]
		n, k := binary.Uvarint(e)
		e = e[k:]
		if n == uint64(len(s)) && string(e[4:4+n]) == s {
			return int32(binary.LittleEndian.Uint32(e)), true
		}
	}
}

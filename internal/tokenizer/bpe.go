package tokenizer

import (
	"hash/maphash"
	"sync/atomic"
)

// noMerge is the rank of a pair that has no merge.
const noMerge = ^uint32(0)

// bpe is a byte-level BPE model working on raw bytes: vocab keys and pieces
// are the original bytes, not GPT-2's printable stand-ins.
type bpe struct {
	vocab        *vocab            // raw bytes -> id
	byteID       [256]int32        // id of each single byte
	merges       map[uint64]uint64 // (left id<<32 | right id) -> (rank<<32 | merged id)
	ignoreMerges bool              // a piece that is itself in the vocab is one token
	cache        *pieceCache
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// lookup returns the rank and merged id of a pair.
func (m *bpe) lookup(a, b int32) (uint32, int32) {
	v, ok := m.merges[pairKey(a, b)]
	if !ok {
		return noMerge, -1
	}
	return uint32(v >> 32), int32(uint32(v))
}

// appendPiece appends the ids of one pre-token.
func (m *bpe) appendPiece(dst []int, piece string) []int {
	if len(piece) == 1 {
		return append(dst, int(m.byteID[piece[0]]))
	}
	if m.ignoreMerges {
		if id, ok := m.vocab.id(piece); ok {
			return append(dst, int(id))
		}
	}
	if ids, ok := m.cache.get(piece); ok {
		for _, id := range ids {
			dst = append(dst, int(id))
		}
		return dst
	}
	var buf [64]int32
	ids := buf[:0]
	if len(piece) <= len(buf) {
		ids = m.mergeLinear(ids, piece)
	} else {
		ids = m.mergeHeap(piece)
	}
	m.cache.put(piece, ids)
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst
}

// mergeLinear applies merges by repeatedly taking the lowest-ranked pair
// (leftmost on ties), the order HF's heap yields. Quadratic, so only for
// short pieces.
func (m *bpe) mergeLinear(ids []int32, piece string) []int32 {
	var rbuf [64]uint32
	for i := 0; i < len(piece); i++ {
		ids = append(ids, m.byteID[piece[i]])
	}
	ranks := rbuf[:len(ids)-1]
	for i := range ranks {
		ranks[i], _ = m.lookup(ids[i], ids[i+1])
	}
	for len(ids) > 1 {
		best, at := noMerge, -1
		for i, r := range ranks {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		_, merged := m.lookup(ids[at], ids[at+1])
		ids[at] = merged
		copy(ids[at+1:], ids[at+2:])
		ids = ids[:len(ids)-1]
		copy(ranks[at:], ranks[at+1:])
		ranks = ranks[:len(ranks)-1]
		if at > 0 {
			ranks[at-1], _ = m.lookup(ids[at-1], ids[at])
		}
		if at < len(ranks) {
			ranks[at], _ = m.lookup(ids[at], ids[at+1])
		}
	}
	return ids
}

// mergeHeap is HF's word.rs merge_all: a min-heap of (rank, position)
// candidates over a linked list of symbols, skipping stale entries.
func (m *bpe) mergeHeap(piece string) []int32 {
	n := len(piece)
	type sym struct {
		id         int32
		prev, next int32
		gone       bool
	}
	syms := make([]sym, n)
	for i := range syms {
		syms[i] = sym{id: m.byteID[piece[i]], prev: int32(i - 1), next: int32(i + 1)}
	}
	syms[n-1].next = -1
	h := mergeHeap{}
	for i := 0; i+1 < n; i++ {
		if r, id := m.lookup(syms[i].id, syms[i+1].id); r != noMerge {
			h.push(mergeCand{rank: r, pos: int32(i), id: id})
		}
	}
	for len(h) > 0 {
		top := h.pop()
		s := &syms[top.pos]
		if s.gone || s.next < 0 {
			continue
		}
		right := syms[s.next]
		if r, id := m.lookup(s.id, right.id); r == noMerge || id != top.id {
			continue
		}
		s.id = top.id
		syms[s.next].gone = true
		s.next = right.next
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if s.prev >= 0 {
			if r, id := m.lookup(syms[s.prev].id, s.id); r != noMerge {
				h.push(mergeCand{rank: r, pos: s.prev, id: id})
			}
		}
		if s.next >= 0 {
			if r, id := m.lookup(s.id, syms[s.next].id); r != noMerge {
				h.push(mergeCand{rank: r, pos: top.pos, id: id})
			}
		}
	}
	out := make([]int32, 0, n/2+1)
	for i := int32(0); i >= 0; i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}

type mergeCand struct {
	rank uint32
	pos  int32
	id   int32
}

func (a mergeCand) less(b mergeCand) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

// mergeHeap is a binary min-heap (container/heap without the interface cost).
type mergeHeap []mergeCand

func (h *mergeHeap) push(c mergeCand) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeCand {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, r, min := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].less(s[min]) {
			min = l
		}
		if r < len(s) && s[r].less(s[min]) {
			min = r
		}
		if min == i {
			break
		}
		s[i], s[min] = s[min], s[i]
		i = min
	}
	*h = s
	return top
}

// maxCachedPiece is the longest piece kept in the cache.
const maxCachedPiece = 48

// maxCachedIDs is the most ids a piece kept in the cache may have: most pieces are one to
// four tokens, and a piece of many short tokens is rarely seen twice.
const maxCachedIDs = 12

// pieceCache is a direct-mapped cache from piece to ids. Slots are atomic
// pointers to immutable entries, so concurrent readers and writers need no
// lock; a collision simply replaces the older entry.
type pieceCache struct {
	seed  maphash.Seed
	slots []atomic.Pointer[cacheEntry]
	mask  uint64
}

// cacheEntry is one piece and its ids, without pointers: a full cache is 65,536 objects
// the garbage collector marks but never scans, not three times as many to follow.
type cacheEntry struct {
	keyLen, n uint8
	key       [maxCachedPiece]byte
	ids       [maxCachedIDs]int32
}

func newPieceCache(bits uint) *pieceCache {
	return &pieceCache{
		seed:  maphash.MakeSeed(),
		slots: make([]atomic.Pointer[cacheEntry], 1<<bits),
		mask:  1<<bits - 1,
	}
}

func (c *pieceCache) get(piece string) ([]int32, bool) {
	if len(piece) > maxCachedPiece {
		return nil, false
	}
	e := c.slots[maphash.String(c.seed, piece)&c.mask].Load()
	if e == nil || string(e.key[:e.keyLen]) != piece {
		return nil, false
	}
	return e.ids[:e.n], true
}

func (c *pieceCache) put(piece string, ids []int32) {
	if len(piece) > maxCachedPiece || len(ids) > maxCachedIDs {
		return
	}
	e := &cacheEntry{keyLen: uint8(len(piece)), n: uint8(len(ids))}
	copy(e.key[:], piece)
	copy(e.ids[:], ids)
	c.slots[maphash.String(c.seed, piece)&c.mask].Store(e)
}

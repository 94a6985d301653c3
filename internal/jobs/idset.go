package jobs

import (
	"encoding/binary"
	"hash/maphash"
)

// idSet remembers custom_ids and the line of their first use, compactly enough for files of
// millions of lines. Its ids are spread by hash over idShards shards, so that a Reader that
// parses ahead (SetParallel) adds a group's ids on several goroutines, one per shard at a
// time: an id always lands in the same shard, which sees its ids in line order, so the first
// use of an id is the one it keeps.
type idSet struct {
	seed   maphash.Seed
	shards [idShards]idShard
}

// idShards is the number of an idSet's shards, and so the most goroutines that add a group's
// ids at once.
const idShards = 8

// idShard is a shard of an idSet: a pointer-free map from a 64-bit hash to an offset into an
// append-only arena of (line, id) records, so the garbage collector never scans it and there
// is one allocation per arena chunk rather than one string per id. Hash collisions are
// resolved exactly: the arena holds the id, and a second id with the same hash goes to a
// small overflow map.
type idShard struct {
	chunks   [][]byte
	index    map[uint64]uint64 // hash → chunk<<32 | offset of the first id with that hash
	overflow map[string]int    // ids whose hash collided with a different id → line
}

// idChunkSize is the arena chunk size; ids longer than a chunk get a chunk of their own.
const idChunkSize = 64 << 10

// newIDSet returns an empty set with a random hash seed.
func newIDSet() idSet { return idSet{seed: maphash.MakeSeed()} }

// hash is the hash of id that idShard.add takes. It may be called from any goroutine.
func (s *idSet) hash(id string) uint64 { return maphash.String(s.seed, id) }

// shardOf is the shard of an id of hash h.
func shardOf(h uint64) int { return int(h >> 61) } // the top 3 bits: idShards is 8

// add records id as used on line. If id was recorded before it returns the first line and true.
func (s *idSet) add(id string, line int) (first int, dup bool) {
	h := s.hash(id)
	return s.shards[shardOf(h)].add(h, id, line)
}

// add records id, of hash h, as used on line, as idSet.add does.
func (s *idShard) add(h uint64, id string, line int) (first int, dup bool) {
	if s.index == nil {
		s.index = make(map[uint64]uint64)
	}
	ref, ok := s.index[h]
	if !ok {
		s.index[h] = s.store(id, line)
		return 0, false
	}
	if l, got := s.load(ref); string(got) == id {
		return l, true
	}
	if l, ok := s.overflow[id]; ok {
		return l, true
	}
	if s.overflow == nil {
		s.overflow = make(map[string]int)
	}
	s.overflow[id] = line
	return 0, false
}

// remove forgets id, of hash h, which add recorded as a first use (Reader.NextFile drops the
// lines added ahead of their return). If another id of that hash waits in overflow, it takes
// the index's place, where add looks first.
func (s *idShard) remove(h uint64, id string, hash func(string) uint64) {
	if ref, ok := s.index[h]; ok {
		if _, got := s.load(ref); string(got) == id {
			delete(s.index, h)
			for other, line := range s.overflow {
				if hash(other) == h {
					delete(s.overflow, other)
					s.index[h] = s.store(other, line)
					break
				}
			}
			return
		}
	}
	delete(s.overflow, id)
}

// store appends a (line, id) record and returns its reference.
func (s *idShard) store(id string, line int) uint64 {
	need := 2*binary.MaxVarintLen64 + len(id)
	if n := len(s.chunks); n == 0 || cap(s.chunks[n-1])-len(s.chunks[n-1]) < need {
		s.chunks = append(s.chunks, make([]byte, 0, max(idChunkSize, need)))
	}
	ci := len(s.chunks) - 1
	c := s.chunks[ci]
	off := len(c)
	c = binary.AppendUvarint(c, uint64(line))
	c = binary.AppendUvarint(c, uint64(len(id)))
	c = append(c, id...)
	s.chunks[ci] = c
	return uint64(ci)<<32 | uint64(off)
}

// load reads the record at ref; id aliases the arena.
func (s *idShard) load(ref uint64) (line int, id []byte) {
	c := s.chunks[ref>>32][ref&(1<<32-1):]
	l, n := binary.Uvarint(c)
	c = c[n:]
	size, n := binary.Uvarint(c)
	c = c[n:]
	return int(l), c[:size]
}

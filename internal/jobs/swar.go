package jobs

import (
	"encoding/binary"
	"math/bits"
)

// The scans below skip the plain bytes of a JSON string eight at a time, testing all eight in
// one 64-bit word (SWAR: SIMD within a register) instead of one by one. A prompt is most of a
// job's bytes and a completion's text most of a result's, and every line submit reads and
// every job and result a worker handles is scanned (bench comparison 2).

const (
	ones = 0x0101010101010101 // 0x01 in every byte
	high = 0x8080808080808080 // the high bit of every byte
)

// bytesBelow marks, with its high bit, the first byte of x (in memory order: x is loaded
// little-endian) whose value is below n (n <= 0x80). Bytes after the first marked one may be
// marked too (a borrow runs on), so only the first mark counts.
func bytesBelow(x uint64, n byte) uint64 { return (x - ones*uint64(n)) & ^x & high }

// bytesEqual marks the first byte of x that equals c, as bytesBelow does.
func bytesEqual(x uint64, c byte) uint64 { return bytesBelow(x^(ones*uint64(c)), 1) }

// specialInString marks the first byte of x that ends a run of plain string bytes: '"', '\\'
// or a control character.
func specialInString(x uint64) uint64 {
	return bytesEqual(x, '"') | bytesEqual(x, '\\') | bytesBelow(x, 0x20)
}

// firstMarked is the index (0-7) of the first byte marked in m != 0.
func firstMarked(m uint64) int { return bits.TrailingZeros64(m) >> 3 }

// plainEnd returns the index of the first '"', '\\' or control character at or after j in b,
// or len(b) (or j, when j > len(b)).
func plainEnd(b []byte, j int) int {
	for ; j+8 <= len(b); j += 8 {
		if m := specialInString(binary.LittleEndian.Uint64(b[j:])); m != 0 {
			return j + firstMarked(m)
		}
	}
	for ; j < len(b); j++ {
		if c := b[j]; c == '"' || c == '\\' || c < 0x20 {
			return j
		}
	}
	return j
}

// asciiPlainEnd returns the index of the first byte at or after i in s that JSON must escape or
// that is not ASCII: '"', '\\', a control character or a byte >= 0x80; len(s) if none.
func asciiPlainEnd(s string, i int) int {
	for ; i+8 <= len(s); i += 8 {
		x := load64(s, i)
		if m := specialInString(x) | x&high; m != 0 {
			return i + firstMarked(m)
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' || c < 0x20 || c >= 0x80 {
			return i
		}
	}
	return i
}

// load64 is s[i:i+8] as a little-endian word (the compiler makes it one load).
func load64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

package ftoa

import (
	"encoding/binary"
	"math/bits"
)

// maxDecimal is the room layOut writes in. The farthest it writes is 14 bytes: "0.000" and
// nine digits, or nine digits with "." among them and "e-45" after them (writeDigits' store
// of eight reaches no farther).
const maxDecimal = 16

// appendDecimal appends d (nonzero; its sign already written) in strconv's shortest 'g'
// layout. It writes in dst's spare capacity when there is room, not in a buffer to be copied:
// a result line writes such a number for every token. When there is not, it appends what
// it wrote in a buffer, so that dst grows no more than the number needs.
func appendDecimal(dst []byte, d decimal) []byte {
	n := len(dst)
	if cap(dst)-n < maxDecimal {
		var buf [maxDecimal]byte
		return append(dst, buf[:layOut(&buf, d)]...)
	}
	return dst[:n+layOut((*[maxDecimal]byte)(dst[n:n+maxDecimal]), d)]
}

// layOut writes d at the start of out and returns its length: positional when the decimal
// exponent of its first digit is in [-4, 6), as 1.25e-05 otherwise (the exponent signed, of
// two digits at least). It may write past that length.
func layOut(out *[maxDecimal]byte, d decimal) int {
	for d.digits%10 == 0 {
		d.digits /= 10
		d.exponent++
	}
	nd := digitCount(d.digits)
	point := nd + d.exponent // the value is 0.digits·10^point
	switch exp := point - 1; {
	case exp < -4 || exp >= 6:
		writeDigits(out[1:], d.digits, nd)
		out[0] = out[1]
		m := 1
		if nd > 1 {
			out[1] = '.'
			m = nd + 1
		}
		out[m], out[m+1] = 'e', '+'
		if exp < 0 {
			out[m+1], exp = '-', -exp
		}
		out[m+2], out[m+3] = pairs[2*exp], pairs[2*exp+1] // a float32's is below 100
		return m + 4
	case point <= 0:
		m := copy(out[:], "0.000"[:2-point]) // point ≥ -3: the exponent is -4 at least
		writeDigits(out[m:], d.digits, nd)
		return m + nd
	case point >= nd:
		writeDigits(out[:], d.digits, nd)
		return nd + copy(out[nd:], "00000"[:point-nd])
	}
	// The point among the digits.
	writeDigits(out[1:], d.digits, nd)
	copy(out[:point], out[1:point+1])
	out[point] = '.'
	return nd + 1
}

// writeDigits writes the nd decimal digits of v at the start of out, which has room for 9:
// the last eight in one store, made by encodeDigits, and the ninth, if any, before them. It
// may write past the digits, up to out[8].
func writeDigits(out []byte, v uint32, nd int) {
	if nd == 9 {
		out[0] = byte('0' + v/1e8)
		binary.LittleEndian.PutUint64(out[1:], encodeDigits(v%1e8))
		return
	}
	binary.LittleEndian.PutUint64(out, encodeDigits(v)>>(8*(8-nd)))
}

// encodeDigits returns the eight decimal digits of v < 10^8, leading zeros included, as eight
// bytes in little-endian order (the first digit lowest): the two halves of four digits are
// split in lanes of one word into pairs, then the pairs into digits, by multiplications that
// divide by 100 and by 10 (P. Khuong's, as in D. Lemire, "Converting integers to fix-digit
// representations quickly", 2021).
func encodeDigits(v uint32) uint64 {
	merged := uint64(v/1e4) | uint64(v%1e4)<<32 // two lanes of 32 bits, each below 10^4
	hundreds := merged * 10486 >> 20 & (0x7f<<32 | 0x7f)
	pairs := (merged-100*hundreds)<<16 | hundreds // four lanes of 16 bits, each below 100
	tens := pairs * 103 >> 10 & (0xf<<48 | 0xf<<32 | 0xf<<16 | 0xf)
	digits := (pairs-10*tens)<<8 | tens // eight lanes of 8 bits, each below 10
	return digits | 0x3030303030303030
}

// digitCount is the number of decimal digits of v > 0.
func digitCount(v uint32) int {
	n := bits.Len32(v) * 1233 >> 12 // ⌊log10 2^len⌋: the count, or one less
	if v >= powersOfTen[n] {
		n++
	}
	return n
}

// powersOfTen[i] is 10^i.
var powersOfTen = [...]uint32{1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}

// pairs holds the two digits of every number below 100, 00 to 99.
const pairs = "00010203040506070809101112131415161718192021222324252627282930313233343536373839404142434445464748495051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899"

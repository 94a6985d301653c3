package ftoa

import (
	"math"
	"math/bits"
)

// The shape of a float32 (Giulietti §2, for precision P = 24 and exponent width W = 8): a
// finite nonzero value is c·2^q, c < 2^P, q ≥ qMin.
const (
	precision    = 24
	fractionMask = 1<<(precision-1) - 1
	exponentMask = 0xff
	qMin         = -149 // the exponent of the subnormals
	cMin         = 1 << (precision - 1)
)

// AppendFloat32 appends f to dst as strconv.AppendFloat(dst, float64(f), 'g', -1, 32) does:
// the shortest decimal that reads back as f (of two, the nearer; of two as near, the even,
// or at a power of two the greater), in positional form when its decimal exponent is in
// [-4, 6), in exponent form otherwise, and "NaN", "+Inf" or "-Inf" for those. Unlike strconv,
// it may write in up to 16 bytes of dst's spare capacity past what it appends.
func AppendFloat32(dst []byte, f float32) []byte {
	b := math.Float32bits(f)
	fraction := b & fractionMask
	biased := int(b>>(precision-1)) & exponentMask
	if biased == exponentMask {
		switch {
		case fraction != 0:
			return append(dst, "NaN"...)
		case b>>31 != 0:
			return append(dst, "-Inf"...)
		}
		return append(dst, "+Inf"...)
	}
	if b>>31 != 0 {
		dst = append(dst, '-')
	}
	if biased == 0 {
		if fraction == 0 {
			return append(dst, '0')
		}
		return appendDecimal(dst, shortest(qMin, fraction))
	}
	c := cMin | fraction
	q := biased + qMin - 1
	// An integer below 2^24 is its own shortest decimal (Giulietti §8.3).
	if -precision < q && q < 0 && c&(1<<-q-1) == 0 {
		return appendDecimal(dst, decimal{digits: c >> -q})
	}
	return appendDecimal(dst, shortest(q, c))
}

// decimal is digits·10^exponent.
type decimal struct {
	digits   uint32
	exponent int
}

// shortest returns the decimal that AppendFloat32 writes for c·2^q (Giulietti §9, and the Java
// FloatToDecimal.toDecimal). The value's rounding interval, which holds every real that rounds
// to it, is bounded by the midpoints to its neighbours; it is scaled by 10^-k so that it is
// about one to ten units wide, and the scaled bounds are computed to within a bit, rounded to
// odd so that an exact bound stays apart from an inexact one. The decimal is then a multiple
// of ten in the interval, if there is one, else the integer around v that it holds (of two,
// the nearer).
//
// Two departures from the Java code, both to write what strconv writes: Java writes at least
// two digits, so it scales a subnormal's c below 8 by ten first, where this code tries the
// multiples of ten from s ≥ 10 on (not 100), which finds a one-digit decimal for those too;
// and a tie between s and t at a power of two goes up, as in strconv's Dragonbox, not to
// the even one.
func shortest(q int, c uint32) decimal {
	out := uint64(c & 1) // an odd c's bounds round away from it, so they are excluded
	cb := uint64(c) << 2
	cbr := cb + 2
	var cbl uint64
	var k int
	if c != cMin || q == qMin {
		cbl = cb - 2
		k = floorLog10Pow2(q)
	} else { // a power of two: its lower neighbour is half as far
		cbl = cb - 1
		k = floorLog10ThreeQuartersPow2(q)
	}
	h := q + floorLog2Pow10(-k) + 33
	g := tenToMinus[k-kMin] + 1
	vb := roundToOdd(g, cb<<h)
	vbl := roundToOdd(g, cbl<<h)
	vbr := roundToOdd(g, cbr<<h)

	s := vb >> 2
	if s >= 10 {
		// One digit fewer, if the interval holds one of the two such decimals around v.
		sp10 := s / 10 * 10
		tp10 := sp10 + 10
		upin := vbl+out <= sp10<<2
		wpin := tp10<<2+out <= vbr
		if upin != wpin {
			if upin {
				return decimal{uint32(sp10), k}
			}
			return decimal{uint32(tp10), k}
		}
	}
	t := s + 1
	uin := vbl+out <= s<<2
	win := t<<2+out <= vbr
	if uin != win {
		if uin {
			return decimal{uint32(s), k}
		}
		return decimal{uint32(t), k}
	}
	// Both in the interval: the nearer to v; on a tie the even one, or t at a power of two.
	if mid := (s + t) << 1; vb < mid || vb == mid && s&1 == 0 && c != cMin {
		return decimal{uint32(s), k}
	}
	return decimal{uint32(t), k}
}

// roundToOdd returns g·cp / 2^95, rounded to odd: its last bit is set when the division is
// inexact.
func roundToOdd(g, cp uint64) uint64 {
	hi, _ := bits.Mul64(g, cp)
	return hi>>31 | (hi&(1<<31-1)+(1<<31-1))>>31
}

// floorLog10Pow2 is ⌊log10(2^e)⌋ for |e| ≤ 5,456,721.
func floorLog10Pow2(e int) int { return e * 661_971_961_083 >> 41 }

// floorLog10ThreeQuartersPow2 is ⌊log10(3/4·2^e)⌋ for |e| ≤ 5,456,721.
func floorLog10ThreeQuartersPow2(e int) int {
	return (e*661_971_961_083 - 274_743_187_321) >> 41
}

// floorLog2Pow10 is ⌊log2(10^e)⌋ for |e| ≤ 1,838,394.
func floorLog2Pow10(e int) int { return e * 913_124_641_741 >> 38 }

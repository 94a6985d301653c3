package ftoa

import (
	"math/big"
	"testing"
)

// TestTenToMinusIsItsDefinition recomputes the table with exact arithmetic: for each k, g is
// ⌊10^-k·2^-r⌋ + 1 with r = ⌊log2 10^-k⌋ - 125, so that 2^125 < g ≤ 2^126 (Giulietti §9.2.2),
// and the table holds its upper part, g >> 63.
func TestTenToMinusIsItsDefinition(t *testing.T) {
	if len(tenToMinus) != kMax-kMin+1 {
		t.Fatalf("%d entries for k in [%d, %d]", len(tenToMinus), kMin, kMax)
	}
	for k := kMin; k <= kMax; k++ {
		if got, want := tenToMinus[k-kMin], upperG(k); got != want {
			t.Errorf("k = %d: %#x, want %#x", k, got, want)
		}
		if r := floorLog2Pow10(-k); r != exactFloorLog2Pow10(-k) {
			t.Errorf("floorLog2Pow10(%d) = %d, want %d", -k, r, exactFloorLog2Pow10(-k))
		}
	}
}

// upperG is g >> 63 for k, computed with big integers.
func upperG(k int) uint64 {
	ten := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(k))), nil)
	shift := 125 - exactFloorLog2Pow10(-k) // 10^-k·2^shift lies in [2^125, 2^126)
	g := new(big.Int)
	switch {
	case k <= 0 && shift >= 0:
		g.Lsh(ten, uint(shift))
	case k <= 0:
		g.Rsh(ten, uint(-shift)) // the floor
	default:
		g.Lsh(big.NewInt(1), uint(shift))
		g.Quo(g, ten)
	}
	g.Add(g, big.NewInt(1))
	return g.Rsh(g, 63).Uint64()
}

// exactFloorLog2Pow10 is ⌊log2 10^e⌋, computed with big integers.
func exactFloorLog2Pow10(e int) int {
	ten := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(e))), nil)
	if e >= 0 {
		return ten.BitLen() - 1
	}
	return -ten.BitLen() // 10^|e| is no power of two: ⌊-log2 10^|e|⌋ = -⌈log2 10^|e|⌉
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

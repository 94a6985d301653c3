package ftoa

import (
	"bytes"
	"flag"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
)

var exhaustive = flag.Bool("exhaustive", false, "check all 2^32 float32 bit patterns against strconv (about two minutes on two cores)")

// check fails t when AppendFloat32 writes other bytes than strconv for the float32 of bits b.
func check(t testing.TB, b uint32) {
	f := math.Float32frombits(b)
	got := AppendFloat32(nil, f)
	if want := strconv.AppendFloat(nil, float64(f), 'g', -1, 32); !bytes.Equal(got, want) {
		t.Fatalf("bits %#08x: %q, want %q", b, got, want)
	}
}

// TestEveryKindOfValueIsWrittenAsStrconvWritesIt checks the values whose paths differ: every
// binary exponent, with the significands at its ends (the powers of two have an uneven
// rounding interval) and random ones between, both signs; the subnormals, all of the
// smallest (whose decimals have fewest digits) and the largest; the integers
// around each power of ten (the integer path and the exponent form from 1e+06); NaN,
// infinities and zeros.
func TestEveryKindOfValueIsWrittenAsStrconvWritesIt(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sign := range []uint32{0, 1 << 31} {
		for biased := uint32(0); biased <= exponentMask; biased++ {
			fractions := []uint32{0, 1, 2, 3, 4, 5, fractionMask, fractionMask - 1, 1 << 22, 1<<22 - 1, 1<<22 + 1}
			for range 64 {
				fractions = append(fractions, rng.Uint32()&fractionMask)
			}
			for _, fraction := range fractions {
				check(t, sign|biased<<(precision-1)|fraction)
			}
		}
		for fraction := uint32(0); fraction < 1<<16; fraction++ {
			check(t, sign|fraction)
			check(t, sign|(fractionMask-fraction))
		}
		for p := 1.0; p < 1e39; p *= 10 {
			v := math.Float32bits(float32(p))
			for d := uint32(0); d < 64; d++ {
				check(t, sign|(v-d))
				check(t, sign|(v+d))
			}
		}
		for i := uint32(0); i < 1<<12; i++ {
			check(t, sign|math.Float32bits(float32(i)))
		}
	}
}

// TestRandomValuesAreWrittenAsStrconvWritesThem checks a million random bit patterns.
func TestRandomValuesAreWrittenAsStrconvWritesThem(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	for range n {
		check(t, rng.Uint32())
	}
}

// TestAllValuesAreWrittenAsStrconvWritesThem checks all 2^32 bit patterns (-exhaustive).
func TestAllValuesAreWrittenAsStrconvWritesThem(t *testing.T) {
	if !*exhaustive {
		t.Skip("-exhaustive checks all 2^32 bit patterns")
	}
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	failed := make(chan string, workers)
	for w := range workers {
		wg.Go(func() {
			// With room in got, numbers are laid out in place; check's, with none, in a buffer.
			got, want := make([]byte, 0, 32), make([]byte, 0, 32)
			for b := uint64(w); b < 1<<32; b += uint64(workers) {
				f := math.Float32frombits(uint32(b))
				got = AppendFloat32(got[:0], f)
				want = strconv.AppendFloat(want[:0], float64(f), 'g', -1, 32)
				if !bytes.Equal(got, want) {
					failed <- strconv.Quote(string(got)) + " for bits " + strconv.FormatUint(b, 16) + ", want " + strconv.Quote(string(want))
					return
				}
			}
		})
	}
	wg.Wait()
	close(failed)
	for msg := range failed {
		t.Error(msg)
	}
}

// TestAppendFloat32AppendsToWhatIsThere checks that dst is kept and grown, not overwritten.
func TestAppendFloat32AppendsToWhatIsThere(t *testing.T) {
	dst := make([]byte, 0, 4)
	dst = append(dst, "[1,"...)
	dst = AppendFloat32(dst, -0.19238281)
	dst = append(dst, ',')
	dst = AppendFloat32(dst, 1.5e-7)
	if got, want := string(dst), "[1,-0.19238281,1.5e-07"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

// TestAppendFloat32GrowsDstOnlyAsNeeded checks that a dst with room for the number alone keeps
// its array (the number is laid out in a buffer, not in room that dst does not have).
func TestAppendFloat32GrowsDstOnlyAsNeeded(t *testing.T) {
	for _, f := range []float32{-0.19238281, 1.5e-07, -3.4028235e+38, 123456, 0.0001, 1} {
		want := strconv.AppendFloat([]byte("[1,"), float64(f), 'g', -1, 32)
		dst := make([]byte, 3, len(want))
		copy(dst, "[1,")
		got := AppendFloat32(dst, f)
		if string(got) != string(want) {
			t.Errorf("%q, want %q", got, want)
		}
		if &got[0] != &dst[0] {
			t.Errorf("%q: dst grown (capacity %d to %d) where it had room", want, cap(dst), cap(got))
		}
	}
}

func FuzzAppendFloat32(f *testing.F) {
	for _, b := range []uint32{0, 1, 7, 8, 0x7f7fffff, 0x80800000, 0x3e44ffff, 0x49742400} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b uint32) { check(t, b) })
}

// BenchmarkAppendFloat32 writes logprobs (float32 values of -Exp(1), as samples' are) with
// this package and, as the baseline, with strconv.
func BenchmarkAppendFloat32(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	values := make([]float32, 1024)
	for i := range values {
		values[i] = float32(-rng.ExpFloat64())
	}
	buf := make([]byte, 0, 32)
	b.Run("ftoa", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			buf = AppendFloat32(buf[:0], values[i%len(values)])
		}
	})
	b.Run("strconv", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			buf = strconv.AppendFloat(buf[:0], float64(values[i%len(values)]), 'g', -1, 32)
		}
	})
}

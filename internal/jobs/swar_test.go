package jobs

import (
	"bytes"
	"testing"
)

// naivePlainEnd and naiveASCIIPlainEnd are plainEnd and asciiPlainEnd one byte at a time.
func naivePlainEnd(b []byte, j int) int {
	for ; j < len(b); j++ {
		if c := b[j]; c == '"' || c == '\\' || c < 0x20 {
			return j
		}
	}
	return j
}

func naiveASCIIPlainEnd(s string, i int) int {
	for ; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' || c < 0x20 || c >= 0x80 {
			return i
		}
	}
	return i
}

// checkPlainEnds compares the word-at-a-time scans with the byte-at-a-time ones from every
// start in b.
func checkPlainEnds(t *testing.T, b []byte) {
	t.Helper()
	for j := 0; j <= len(b); j++ {
		if got, want := plainEnd(b, j), naivePlainEnd(b, j); got != want {
			t.Fatalf("plainEnd(%q, %d) = %d, want %d", b, j, got, want)
		}
		if got, want := asciiPlainEnd(string(b), j), naiveASCIIPlainEnd(string(b), j); got != want {
			t.Fatalf("asciiPlainEnd(%q, %d) = %d, want %d", b, j, got, want)
		}
	}
}

// TestPlainEndEveryByteEverywhere puts each of the 256 byte values at each position of a
// 19-byte run of plain bytes (two words and a tail), alone and after a byte that borrows: the
// first special byte must be found wherever it sits in a word.
func TestPlainEndEveryByteEverywhere(t *testing.T) {
	for p := range 19 {
		for v := range 256 {
			b := bytes.Repeat([]byte{'a'}, 19)
			b[p] = byte(v)
			checkPlainEnds(t, b)
			if p+1 < len(b) {
				b[p+1] = '"' // a later special byte must not hide or move the first
				checkPlainEnds(t, b)
			}
			if p > 0 {
				b[p-1] = 0x00 // a borrow from the byte before
				checkPlainEnds(t, b)
			}
		}
	}
}

// FuzzPlainEnd holds the word-at-a-time scans to the byte-at-a-time ones on any input.
func FuzzPlainEnd(f *testing.F) {
	f.Add([]byte(`plain ascii text, then "a quote`))
	f.Add([]byte("tab\there and a backslash \\ and \x7f and caf\xc3\xa9 \xff"))
	f.Add([]byte{0x21, 0x20, 0x1f, 0x5b, 0x5c, 0x5d, 0x22, 0x23, 0x80, 0x7f, 0x00, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) { checkPlainEnds(t, b) })
}

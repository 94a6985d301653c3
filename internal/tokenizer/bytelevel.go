package tokenizer

import "unicode/utf8"

// byteToRune is GPT-2's bytes_to_unicode table: the printable byte values
// stand for themselves and the others are shifted to U+0100 and above, so
// every byte has a visible character in tokenizer.json.
var byteToRune = func() (t [256]rune) {
	n := rune(0)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
			continue
		}
		t[b] = 256 + n
		n++
	}
	return t
}()

// runeToByte inverts byteToRune; runes below 324 (256+68) are the only ones used.
var runeToByte = func() (t [324]int16) {
	for i := range t {
		t[i] = -1
	}
	for b, r := range byteToRune {
		t[r] = int16(b)
	}
	return t
}()

// byteLevelDecode turns a byte-level token string back into raw bytes. If a
// character is not one of the 256 byte characters, the token is returned as
// its own UTF-8 bytes, as the HF ByteLevel decoder does.
func byteLevelDecode(tok string) (string, bool) {
	out, ok := appendByteLevelDecoded(make([]byte, 0, len(tok)), []byte(tok))
	return string(out), ok
}

// appendByteLevelDecoded appends byteLevelDecode(tok) to dst.
func appendByteLevelDecoded(dst, tok []byte) ([]byte, bool) {
	start := len(dst)
	for _, r := range string(tok) {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return append(dst[:start], tok...), false
		}
		dst = append(dst, byte(runeToByte[r]))
	}
	return dst, true
}

// appendLossyUTF8 appends b to dst, replacing each maximal invalid subpart
// with U+FFFD exactly as Rust's String::from_utf8_lossy does (the Unicode
// "substitution of maximal subparts" practice; Go's own conversions replace
// per byte instead).
func appendLossyUTF8(dst []byte, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			dst = append(dst, b[i:i+size]...)
			i += size
			continue
		}
		// Invalid: consume the longest prefix of a well-formed sequence.
		need, lo, hi := 0, byte(0x80), byte(0xBF)
		switch {
		case c >= 0xC2 && c <= 0xDF:
			need = 1
		case c == 0xE0:
			need, lo = 2, 0xA0
		case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
			need = 2
		case c == 0xED:
			need, hi = 2, 0x9F
		case c == 0xF0:
			need, lo = 3, 0x90
		case c >= 0xF1 && c <= 0xF3:
			need = 3
		case c == 0xF4:
			need, hi = 3, 0x8F
		}
		j := i + 1
		for k := 0; k < need && j < len(b); k++ {
			if b[j] < lo || b[j] > hi {
				break
			}
			lo, hi = 0x80, 0xBF
			j++
		}
		dst = append(dst, "\uFFFD"...)
		i = j
	}
	return dst
}

package corpus

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestBuild(t *testing.T) {
	a, err := Build(100_000)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) < 100_000 {
		t.Fatalf("%d bytes, want at least 100000", len(a))
	}
	b, err := Build(100_000)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("two builds of the same size differ")
	}
	for _, want := range []string{Prose, Multilingual, "package http"} {
		if !strings.Contains(a, want) {
			t.Errorf("corpus lacks %.30q", want)
		}
	}
	if !utf8.ValidString(Multilingual) {
		t.Error("Multilingual is not valid UTF-8")
	}
}

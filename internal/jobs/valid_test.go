package jobs

import (
	"encoding/json"
	"strings"
	"testing"
)

// validJSONCases are inputs at the edges of the grammar, for the test and the fuzz seed.
var validJSONCases = []string{
	``, ` `, `{}`, ` { } `, `[]`, `[ ]`, `{"a":1}`, `{"a" : [1, 2.5, -0, 1e9, 1E-2, 0.1e+3]}`,
	`"x"`, `"\u00e9\n\t\"\\\/\b\f\r"`, `"\u00g0"`, `"\x"`, `"a` + "\x01" + `b"`, `"unterminated`,
	`01`, `-`, `-a`, `1.`, `1.e5`, `.5`, `1e`, `1e+`, `+1`, `-0.0e-0`, `00`, `1 2`,
	`true`, `false`, `null`, `tru`, `nul`, `truex`, `True`, `[true,false,null]`,
	`{"a":1,}`, `[1,]`, `{,}`, `{"a"}`, `{"a":}`, `{1:2}`, `[1 2]`, `{"a":1 "b":2}`, `]`, `}`,
	`{"a":{"b":[{"c":[]}]}}`, `[[[[]]]]`, `[[[[]]]`, "{\"a\":1}\n", "\t[\r\n]", `{"é":"ü"}`,
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000),
}

func TestValidJSONAgreesWithEncodingJSON(t *testing.T) {
	for _, c := range validJSONCases {
		if got, want := validJSON([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("validJSON(%.60q) = %v; json.Valid says %v", c, got, want)
		}
	}
}

// FuzzValidJSON holds validJSON to json.Valid on any input.
func FuzzValidJSON(f *testing.F) {
	for _, c := range validJSONCases {
		f.Add([]byte(c))
	}
	f.Add([]byte(`{"custom_id":"job-1","model":"m","prompt":"Say \"hi\".","params":{"max_tokens":16,"temperature":0.7}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v; json.Valid says %v", b, got, want)
		}
	})
}

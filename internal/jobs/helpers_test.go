package jobs

import (
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

// item is one outcome of Reader.Next: a job or a line error.
type item struct {
	job  Job
	lerr *LineError
	line int
}

// readAll drains a Reader and returns every outcome and the terminal error (io.EOF normally).
func readAll(t *testing.T, r *Reader) ([]item, error) {
	t.Helper()
	var out []item
	for i := 0; i < 1_000_000; i++ {
		j, err := r.Next()
		if err == nil {
			out = append(out, item{job: j, line: r.Line()})
			continue
		}
		var le *LineError
		if errors.As(err, &le) {
			if le.Line != r.Line() {
				t.Fatalf("LineError.Line %d != Reader.Line() %d", le.Line, r.Line())
			}
			out = append(out, item{lerr: le, line: le.Line})
			continue
		}
		return out, err
	}
	t.Fatal("reader did not end")
	return nil, nil
}

// readString reads jobs from s with the file name "t.jsonl".
func readString(t *testing.T, s string, l Limits) ([]item, error) {
	t.Helper()
	return readAll(t, NewReader(strings.NewReader(s), "t.jsonl", l))
}

// mustEOF fails unless err is io.EOF.
func mustEOF(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, io.EOF) {
		t.Fatalf("terminal error = %v, want io.EOF", err)
	}
}

func intp(v int) *int           { return &v }
func int64p(v int64) *int64     { return &v }
func floatp(v float64) *float64 { return &v }

func posInf() float64 { return math.Inf(1) }
func nan() float64    { return math.NaN() }

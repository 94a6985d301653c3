package jobs

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// mixedInput is an input of n lines of every kind a Reader meets: good lines of each format,
// bad ones (malformed, invalid, over the limit of 2 KiB), blank and space-padded lines, CRLF
// ends, byte order marks, duplicate custom_ids (of the line before), lines the check below
// refuses and invalid lines, each with an id that a valid line takes after it (no duplicate:
// a line refused takes no id), and trailing blank lines.
func mixedInput(n int, prefix string) string {
	var b strings.Builder
	for i := range n {
		switch i % 23 {
		case 3:
			b.WriteString(`{"custom_id":"x","model":"m",` + "\n")
		case 5:
			b.WriteString(`{"model":"m","prompt":"p"}` + "\r\n")
		case 7:
			fmt.Fprintf(&b, `{"custom_id":"%s-long-%d","model":"m","prompt":"%s"}`+"\n", prefix, i, strings.Repeat("y", 3000))
		case 11:
			b.WriteString("   \n\n")
		case 13:
			fmt.Fprintf(&b, "\xef\xbb\xbf  %s  \n", strings.Replace(genLine(i-1), "job-", prefix+"-", 1)) // the id of the line before: a duplicate
		case 17:
			fmt.Fprintf(&b, `{"custom_id":"%s-refused-%d","model":"refused","prompt":"p"}`+"\n", prefix, i)
		case 19:
			fmt.Fprintf(&b, `{"custom_id":"%s-refused-%d","model":"m","prompt":"p"}`+"\n", prefix, i-2) // valid: the refused line took no id
		case 21:
			fmt.Fprintf(&b, `{"custom_id":"%s-bad-%d","model":"m","prompt":"p","num_samples":0}`+"\n", prefix, i)
		case 22:
			fmt.Fprintf(&b, `{"custom_id":"%s-bad-%d","model":"m","prompt":"p"}`+"\n", prefix, i-1) // valid: the invalid line took no id
		default:
			b.WriteString(strings.Replace(genLine(i), "job-", prefix+"-", 1) + "\n")
		}
	}
	b.WriteString("\n \n")
	return b.String()
}

// outcome is what one Next call gave, and the Reader's Line and Raw after it.
type outcome struct {
	job  Job
	err  string
	eof  bool
	line int
	raw  string
}

// readOutcomes reads every input in turn with r (NextFile for the second and later) until
// each ends, or fails twice, or (for the first, if cut > 0) for cut calls.
func readOutcomes(t *testing.T, r *Reader, inputs []func() io.Reader, names []string, cut int) []outcome {
	t.Helper()
	var out []outcome
	for k, in := range inputs {
		if k > 0 {
			r.NextFile(in(), names[k])
		}
		failed := 0
		for n := 0; ; n++ {
			if n > 1e6 {
				t.Fatal("the reader never ends")
			}
			j, err := r.Next()
			o := outcome{job: j, line: r.Line(), eof: errors.Is(err, io.EOF)}
			if err != nil {
				o.err = err.Error()
			} else {
				o.raw = string(r.Raw())
			}
			out = append(out, o)
			if o.eof || k == 0 && n+1 == cut {
				break
			}
			var le *LineError
			if err != nil && !errors.As(err, &le) && !errors.Is(err, ErrEmptyFile) {
				if failed++; failed == 2 { // the read error, and once more
					break
				}
			}
		}
	}
	return out
}

// TestAParallelReaderReadsAsTheSequentialOne: a Reader that parses its lines ahead on several
// goroutines (SetParallel) returns, call by call, the same jobs, errors, line numbers and raw
// lines as one that parses them one at a time: over groups of lines and their edges, across
// inputs (NextFile, duplicates of an earlier input's ids, an input left before its end), with
// a check, for empty inputs, one of a line over the limit alone (not empty), and one whose
// reading fails after blank lines.
func TestAParallelReaderReadsAsTheSequentialOne(t *testing.T) {
	t.Parallel()
	big := mixedInput(3*aheadLines+37, "a")
	second := mixedInput(aheadLines-1, "b") + strings.Replace(genLine(4), "job-", "a-", 1) // no final line end
	check := func(j Job) *FieldError {
		if j.Model == "refused" {
			return &FieldError{Field: "model", Msg: "refused by the check"}
		}
		return nil
	}
	cases := []struct {
		name   string
		inputs []func() io.Reader
		limits Limits
		meets  []string // errors the input must meet
		takes  []string // custom_ids that valid lines must take
		cut    int      // if > 0, the first input is left after this many calls
	}{
		{"groups and inputs", []func() io.Reader{
			func() io.Reader { return strings.NewReader(big) },
			func() io.Reader { return strings.NewReader("") },
			func() io.Reader { return strings.NewReader(second) },
		}, Limits{MaxLineBytes: 2048}, []string{`duplicate "a-00000012" (first used on line 14)`, "two.jsonl: file has no job lines", "longer than the limit", "refused by the check",
			"malformed JSON", "custom_id: is required", `duplicate "a-00000004" (first used on one.jsonl line`, "num_samples: ", "from 1 to 16"}, []string{"a-bad-21", "a-refused-17"}, 0},
		{"an input left before its end", []func() io.Reader{
			func() io.Reader { return strings.NewReader(big) },
			func() io.Reader { // with the id of a line of the first that was left
				return strings.NewReader(second + "\n" + strings.Replace(genLine(100), "job-", "a-", 1))
			},
		}, Limits{MaxLineBytes: 2048}, []string{"refused by the check"}, []string{"b-00000000", "a-00000100"}, 30},
		{"empty", []func() io.Reader{func() io.Reader { return strings.NewReader("\r\n  \n\t\n") }}, Limits{}, []string{"one.jsonl: file has no job lines"}, nil, 0},
		{"only a line over the limit", []func() io.Reader{func() io.Reader { return strings.NewReader(strings.Repeat("z", 3000)) }},
			Limits{MaxLineBytes: 2048}, []string{"longer than the limit"}, nil, 0},
		{"a read error", []func() io.Reader{func() io.Reader {
			return io.MultiReader(strings.NewReader(mixedInput(aheadLines+5, "c")+"\n\n"), iotest.ErrReader(errors.New("disk on fire")))
		}}, Limits{}, []string{"read one.jsonl after line ", ": disk on fire"}, nil, 0},
	}
	for _, c := range cases {
		names := []string{"one.jsonl", "two.jsonl", "three.jsonl"}[:len(c.inputs)]
		var got [2][]outcome
		for k, parallel := range []int{1, 4} {
			r := NewReader(c.inputs[0](), names[0], c.limits)
			r.SetCheck(check)
			r.SetParallel(parallel)
			got[k] = readOutcomes(t, r, c.inputs, names, c.cut)
		}
		seq, par := got[0], got[1]
		var errs strings.Builder
		for _, o := range seq {
			errs.WriteString(o.err + "\n")
		}
		for _, want := range c.meets {
			if !strings.Contains(errs.String(), want) {
				t.Fatalf("%s: no call said %q: the input does not test what it should", c.name, want)
			}
		}
		for _, id := range c.takes {
			if !slices.ContainsFunc(seq, func(o outcome) bool { return o.err == "" && o.job.CustomID == id }) {
				t.Fatalf("%s: no valid line took %q: the input does not test what it should", c.name, id)
			}
		}
		for i := range min(len(seq), len(par)) {
			if !reflect.DeepEqual(seq[i], par[i]) {
				t.Fatalf("%s: call %d: sequential %+v\nparallel %+v", c.name, i+1, seq[i], par[i])
			}
		}
		if len(seq) != len(par) {
			t.Fatalf("%s: %d calls sequentially, %d in parallel", c.name, len(seq), len(par))
		}
	}
}

package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// verdict is the outcome of one row against its aim.
type verdict int

const (
	verdictInfo verdict = iota // no aim: reported for context
	verdictPass
	verdictMiss
)

func (v verdict) String() string {
	switch v {
	case verdictPass:
		return "pass"
	case verdictMiss:
		return "MISS"
	default:
		return "info"
	}
}

// row is one case of a comparison.
type row struct {
	Case     string
	Measured string
	Baseline string
	Ratio    float64 // measured / baseline; NaN when it has no meaning
	Aim      string
	Verdict  verdict
}

// table is one comparison: its rows and the notes that say what was measured.
type table struct {
	ID    int
	Title string
	Rows  []row
	Notes []string
}

// add appends a row.
func (t *table) add(r row) { t.Rows = append(t.Rows, r) }

// note appends a line printed under the table.
func (t *table) note(format string, args ...any) {
	t.Notes = append(t.Notes, fmt.Sprintf(format, args...))
}

// atLeast judges ratio against a lower bound.
func atLeast(ratio, bound float64) (string, verdict) {
	aim := fmt.Sprintf(">= %.2f", bound)
	if math.IsNaN(ratio) || ratio < bound {
		return aim, verdictMiss
	}
	return aim, verdictPass
}

// atMost judges ratio against an upper bound.
func atMost(ratio, bound float64) (string, verdict) {
	aim := fmt.Sprintf("<= %.2f", bound)
	if math.IsNaN(ratio) || ratio > bound {
		return aim, verdictMiss
	}
	return aim, verdictPass
}

// ratio divides, giving NaN for a zero baseline.
func ratio(measured, baseline float64) float64 {
	if baseline == 0 {
		return math.NaN()
	}
	return measured / baseline
}

// print writes the table with aligned columns.
func (t *table) print(w io.Writer) {
	fmt.Fprintf(w, "\n== %d. %s\n", t.ID, t.Title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "case\tmeasured\tbaseline\tratio\taim\tresult")
	for _, r := range t.Rows {
		rs := "-"
		if !math.IsNaN(r.Ratio) {
			rs = fmt.Sprintf("%.3f", r.Ratio)
		}
		aim := r.Aim
		if aim == "" {
			aim = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Case, r.Measured, r.Baseline, rs, aim, r.Verdict)
	}
	_ = tw.Flush()
	for _, n := range t.Notes {
		fmt.Fprintf(w, "   note: %s\n", n)
	}
}

// printSummary writes one line per comparison and every missed aim.
func printSummary(w io.Writer, tables []*table, failed map[int]error) {
	fmt.Fprintln(w, "\n== summary")
	var misses []string
	for _, t := range tables {
		pass, miss, info := 0, 0, 0
		for _, r := range t.Rows {
			switch r.Verdict {
			case verdictPass:
				pass++
			case verdictMiss:
				miss++
				misses = append(misses, fmt.Sprintf("  MISS %d. %s: %s (ratio %.3f, aim %s)", t.ID, t.Title, r.Case, r.Ratio, r.Aim))
			default:
				info++
			}
		}
		fmt.Fprintf(w, "%d. %-44s pass %d, MISS %d, info %d\n", t.ID, t.Title, pass, miss, info)
	}
	for _, id := range slices.Sorted(maps.Keys(failed)) {
		fmt.Fprintf(w, "%d. did not run to the end: %v\n", id, failed[id])
	}
	if len(misses) > 0 {
		fmt.Fprintln(w, strings.Join(misses, "\n"))
	} else if len(failed) == 0 {
		fmt.Fprintln(w, "every aim met")
	}
}

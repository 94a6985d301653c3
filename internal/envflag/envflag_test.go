package envflag

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestEnvironmentSetsDefaultsAndFlagsWin(t *testing.T) {
	t.Parallel()
	env := map[string]string{"A": "from-env", "N": "7", "D": "2s", "B": "true"}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := New(fs, func(k string) string { return env[k] })
	var (
		a, c string
		n    int
		d    time.Duration
		b    bool
	)
	s.String(&a, "a", "A", "def", "")
	s.String(&c, "c", "C", "def", "")
	s.Int(&n, "n", "N", 1, "")
	s.Duration(&d, "d", "D", time.Second, "")
	s.Bool(&b, "b", "B", false, "")
	if err := fs.Parse([]string{"-n", "9"}); err != nil {
		t.Fatal(err)
	}
	if a != "from-env" || c != "def" || n != 9 || d != 2*time.Second || !b || s.Err() != nil {
		t.Fatalf("a=%q c=%q n=%d d=%v b=%v err=%v", a, c, n, d, b, s.Err())
	}
	if got := fs.Lookup("a").Usage; got != " (env A)" {
		t.Fatalf("usage = %q, want the variable named", got)
	}
}

func TestMalformedEnvironmentIsAnError(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	s := New(fs, func(k string) string { return map[string]string{"N": "lots"}[k] })
	var n int
	s.Int(&n, "n", "N", 1, "")
	if s.Err() == nil {
		t.Fatal("N=lots was accepted")
	}
}

func TestParseAcceptsFlagsAfterArguments(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	out := fs.String("o", "", "")
	wait := fs.Bool("wait", false, "")
	args, err := Parse(fs, []string{"a.jsonl", "-o", "r.jsonl", "b.jsonl", "--wait", "--", "-c.jsonl"})
	if err != nil {
		t.Fatal(err)
	}
	if *out != "r.jsonl" || !*wait || len(args) != 3 || args[0] != "a.jsonl" || args[1] != "b.jsonl" || args[2] != "-c.jsonl" {
		t.Fatalf("o=%q wait=%v args=%q", *out, *wait, args)
	}
}

// A Secret takes its environment's value, a flag wins over it, and neither is ever printed
// in the usage text (the flag package prints it on -h and on a mistyped flag).
func TestSecretsAreNotPrinted(t *testing.T) {
	t.Parallel()
	var usage bytes.Buffer
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(&usage)
	s := New(fs, func(k string) string { return map[string]string{"P": "hunter2"}[k] })
	var p, q string
	s.Secret(&p, "p", "P", "a `password`")
	s.Secret(&q, "q", "Q", "another")
	if p != "hunter2" || q != "" {
		t.Fatalf("p=%q q=%q, want the environment's value and none", p, q)
	}
	if err := fs.Parse([]string{"-q", "s3cret", "--mistyped"}); err == nil {
		t.Fatal("a mistyped flag was accepted")
	}
	if q != "s3cret" || strings.Contains(usage.String(), "hunter2") || !strings.Contains(usage.String(), "-p password") {
		t.Fatalf("q=%q; usage:\n%s", q, usage.String())
	}
}

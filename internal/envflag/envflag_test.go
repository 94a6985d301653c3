package envflag

import (
	"bytes"
	"flag"
	"io"
	"slices"
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

// TestParseEndsTheFlagsAtDoubleDash: everything after "--" is positional, not only the first
// argument after it (the flag package takes the "--" away, so looking for it among the
// arguments it leaves finds none).
func TestParseEndsTheFlagsAtDoubleDash(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args, want []string
		out        string
	}{
		{[]string{"--", "-a.jsonl", "-b.jsonl"}, []string{"-a.jsonl", "-b.jsonl"}, ""},
		{[]string{"x.jsonl", "--", "a.jsonl", "-o", "b.jsonl"}, []string{"x.jsonl", "a.jsonl", "-o", "b.jsonl"}, ""},
		{[]string{"-o", "r.jsonl", "--"}, nil, "r.jsonl"},
		{[]string{"a", "--", "--"}, []string{"a", "--"}, ""},
		{[]string{"-o", "--", "in.jsonl", "-v"}, []string{"in.jsonl"}, "--"}, // "--" as -o's value
		{[]string{"-o=--", "--", "-v"}, []string{"-v"}, "--"},
		{[]string{"-v", "--", "-o"}, []string{"-o"}, ""},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		out := fs.String("o", "", "")
		fs.Bool("v", false, "")
		got, err := Parse(fs, c.args)
		if err != nil || !slices.Equal(got, c.want) || *out != c.out {
			t.Errorf("Parse(%q) = %q, %v, -o %q; want %q, -o %q", c.args, got, err, *out, c.want, c.out)
		}
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

// TestCheckedFlagsRefuseZero: the programs read 0 as "the default", so a 0 given on purpose,
// on the command line or in the environment, is refused rather than quietly replaced.
func TestCheckedFlagsRefuseZero(t *testing.T) {
	t.Parallel()
	define := func(env map[string]string) (*flag.FlagSet, *Set, *int, *int, *time.Duration) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		s := New(fs, func(k string) string { return env[k] })
		var (
			n, m int
			d    time.Duration
		)
		s.PositiveInt(&n, "n", "N", 400, "jobs at once")
		s.NonZeroInt(&m, "m", "M", 10, "deliveries; negative: no limit")
		s.PositiveDuration(&d, "d", "D", time.Minute, "how long")
		return fs, s, &n, &m, &d
	}
	fs, s, n, m, d := define(nil)
	if err := fs.Parse(nil); err != nil || s.Err() != nil || *n != 400 || *m != 10 || *d != time.Minute {
		t.Fatalf("defaults: %v %v n=%d m=%d d=%v", err, s.Err(), *n, *m, *d)
	}
	if err := fs.Parse([]string{"-n", "3", "-m", "-1", "-d", "2s"}); err != nil || *n != 3 || *m != -1 || *d != 2*time.Second {
		t.Fatalf("valid values: %v n=%d m=%d d=%v", err, *n, *m, *d)
	}
	for _, c := range []struct{ args []string }{
		{[]string{"-n", "0"}}, {[]string{"-n", "-2"}}, {[]string{"-n", "x"}},
		{[]string{"-m", "0"}}, {[]string{"-d", "0"}}, {[]string{"-d", "-1s"}}, {[]string{"-d", "5"}},
	} {
		fs, _, n, m, d := define(nil)
		err := fs.Parse(c.args)
		if err == nil || !strings.Contains(err.Error(), "-"+c.args[0][1:]) {
			t.Errorf("%v: err %v (n=%d m=%d d=%v), want the flag refused", c.args, err, *n, *m, *d)
		}
	}
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var e time.Duration
	New(fs, func(string) string { return "" }).NonZeroDuration(&e, "e", "E", time.Second, "timeout; negative: none")
	if err := fs.Parse([]string{"-e", "0s"}); err == nil {
		t.Errorf("-e 0s accepted (%v)", e)
	}
	if err := fs.Parse([]string{"-e", "-1s"}); err != nil || e != -time.Second {
		t.Errorf("-e -1s: %v, %v", err, e)
	}
	for _, env := range []map[string]string{{"N": "0"}, {"M": "0"}, {"D": "0s"}, {"D": "-3m"}} {
		_, s, _, _, _ := define(env)
		if err := s.Err(); err == nil {
			t.Errorf("environment %v accepted", env)
		}
	}
	_, s, n, m, d = define(map[string]string{"N": "7", "M": "-1", "D": "90s"})
	if s.Err() != nil || *n != 7 || *m != -1 || *d != 90*time.Second {
		t.Fatalf("valid environment: %v n=%d m=%d d=%v", s.Err(), *n, *m, *d)
	}
}

func TestCheckedFlagsNameTheirArgument(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	s := New(fs, func(string) string { return "" })
	var d time.Duration
	var n int
	s.PositiveDuration(&d, "grace", "G", 30*time.Second, "time samples get to finish")
	s.PositiveInt(&n, "jobs", "J", 400, "how many `jobs` at once")
	fs.PrintDefaults()
	for _, want := range []string{
		"-grace duration\n", "time samples get to finish (a positive duration) (env G) (default 30s)",
		"-jobs jobs\n", "how many jobs at once (a positive int) (env J) (default 400)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
}

// TestAMalformedVariableIsNamedWithItsFlag: the error of a bad environment value names the
// variable and the flag it is the default of, which -h and the README list by flag.
func TestAMalformedVariableIsNamedWithItsFlag(t *testing.T) {
	t.Parallel()
	env := map[string]string{"N": "lots", "B": "yes", "D": "30", "P": "0", "Z": "0s"}
	for _, define := range []func(*Set){
		func(s *Set) { s.Int(new(int), "n", "N", 1, "") },
		func(s *Set) { s.Bool(new(bool), "b", "B", false, "") },
		func(s *Set) { s.Duration(new(time.Duration), "d", "D", time.Second, "") },
		func(s *Set) { s.PositiveInt(new(int), "p", "P", 1, "") },
		func(s *Set) { s.NonZeroDuration(new(time.Duration), "z", "Z", time.Second, "") },
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		s := New(fs, func(k string) string { return env[k] })
		define(s)
		var name string
		fs.VisitAll(func(f *flag.Flag) { name = f.Name })
		err := s.Err()
		if err == nil || !strings.Contains(err.Error(), strings.ToUpper(name)+"=") || !strings.Contains(err.Error(), "--"+name) {
			t.Errorf("flag %s: error %v, want one naming %s and --%s", name, err, strings.ToUpper(name), name)
		}
	}
}

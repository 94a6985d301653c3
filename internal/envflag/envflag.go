package envflag

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Getenv reads an environment variable: os.Getenv in programs, a map lookup in tests.
type Getenv func(string) string

// Set defines flags on one flag set from one environment. Malformed environment values are
// remembered and reported by Err, not silently replaced by the default.
type Set struct {
	fs     *flag.FlagSet
	getenv Getenv
	errs   []error
}

// New returns a Set defining flags on fs with defaults read through getenv.
func New(fs *flag.FlagSet, getenv Getenv) *Set { return &Set{fs: fs, getenv: getenv} }

// FlagSet is the underlying flag set.
func (s *Set) FlagSet() *flag.FlagSet { return s.fs }

// Err reports the first malformed environment value, if any.
func (s *Set) Err() error {
	if len(s.errs) > 0 {
		return s.errs[0]
	}
	return nil
}

func usage(text, env string) string { return fmt.Sprintf("%s (env %s)", text, env) }

// envErr is the error of a malformed value v of env, the default of flag name: it names both,
// as -h and the README list the settings by flag.
func envErr(env, v, name string, err error) error {
	return fmt.Errorf("%s=%q (the default of --%s): %w", env, v, name, err)
}

// String defines a string flag defaulting to env, or def when env is unset or empty.
func (s *Set) String(p *string, name, env, def, text string) {
	if v := s.getenv(env); v != "" {
		def = v
	}
	s.fs.StringVar(p, name, def, usage(text, env))
}

// Secret defines a string flag defaulting to env, like String, for a value that must not be
// printed: a password, a token, a URL that may hold either. The flag package prints every
// default in its usage text, on -h or a mistyped flag, where it reaches logs; a Secret's is
// never shown.
func (s *Set) Secret(p *string, name, env, text string) {
	*p = s.getenv(env)
	s.fs.Var(secretValue{p}, name, usage(text, env))
}

// secretValue is a Secret's flag.Value: its String is always empty, so that the flag
// package records no default to print.
type secretValue struct{ p *string }

func (v secretValue) String() string { return "" }

func (v secretValue) Set(s string) error {
	*v.p = s
	return nil
}

// Int defines an int flag defaulting to env, or def.
func (s *Set) Int(p *int, name, env string, def int, text string) {
	if v := s.getenv(env); v != "" {
		n, err := parseInt(v)
		if err != nil {
			s.errs = append(s.errs, envErr(env, v, name, err))
		} else {
			def = n
		}
	}
	s.fs.IntVar(p, name, def, usage(text, env))
}

// Bool defines a bool flag defaulting to env, or def.
func (s *Set) Bool(p *bool, name, env string, def bool, text string) {
	if v := s.getenv(env); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.errs = append(s.errs, envErr(env, v, name, errors.New("not a boolean such as true or false")))
		} else {
			def = b
		}
	}
	s.fs.BoolVar(p, name, def, usage(text, env))
}

// Duration defines a duration flag defaulting to env, or def.
func (s *Set) Duration(p *time.Duration, name, env string, def time.Duration, text string) {
	if v := s.getenv(env); v != "" {
		d, err := parseDuration(v)
		if err != nil {
			s.errs = append(s.errs, envErr(env, v, name, err))
		} else {
			def = d
		}
	}
	s.fs.DurationVar(p, name, def, usage(text, env))
}

// endedAtDoubleDash reports whether the flag package stopped at a "--" of its own in parsed,
// the arguments it consumed: not at a "--" that was a flag's value (-sep --).
func endedAtDoubleDash(fs *flag.FlagSet, parsed []string) bool {
	for i := 0; i < len(parsed); i++ {
		a := parsed[i]
		if a == "--" {
			return i == len(parsed)-1
		}
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		if f := fs.Lookup(name); f != nil {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				i++ // its value, whatever it looks like
			}
		}
	}
	return false
}

// PositiveInt defines an int flag like Int whose value, from the environment or the command
// line, must be above zero. The programs' configurations read 0 as "the default", so a 0
// given on purpose would quietly mean 400 or 1000; it is refused instead.
func (s *Set) PositiveInt(p *int, name, env string, def int, text string) {
	checkedVar(s, p, name, env, def, text, "a positive `int`", parseInt, func(n int) error {
		if n <= 0 {
			return errors.New("must be a positive integer")
		}
		return nil
	})
}

// NonZeroInt defines an int flag like Int that may be negative (the flag says what that
// means, no limit for example), but not 0, for the reason PositiveInt gives.
func (s *Set) NonZeroInt(p *int, name, env string, def int, text string) {
	checkedVar(s, p, name, env, def, text, "an `int`, not 0", parseInt, func(n int) error {
		if n == 0 {
			return errors.New("must not be 0")
		}
		return nil
	})
}

// PositiveDuration defines a duration flag like Duration whose value must be above zero, for
// the reason PositiveInt gives (a NATS user would also read a max age of 0 as for ever).
func (s *Set) PositiveDuration(p *time.Duration, name, env string, def time.Duration, text string) {
	checkedVar(s, p, name, env, def, text, "a positive `duration`", parseDuration, func(d time.Duration) error {
		if d <= 0 {
			return errors.New("must be a positive duration")
		}
		return nil
	})
}

// NonZeroDuration defines a duration flag like Duration that may be negative (the flag says
// what that means), but not 0, for the reason PositiveInt gives.
func (s *Set) NonZeroDuration(p *time.Duration, name, env string, def time.Duration, text string) {
	checkedVar(s, p, name, env, def, text, "a `duration`, not 0", parseDuration, func(d time.Duration) error {
		if d == 0 {
			return errors.New("must not be 0")
		}
		return nil
	})
}

func parseInt(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errors.New("not an integer")
	}
	return n, nil
}

func parseDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errors.New("not a duration such as 30s")
	}
	return d, nil
}

// checkedVar defines a flag of type T that parse reads and check accepts, defaulting to env,
// or def. rule, which says what check accepts, is appended to the usage text; its back-quoted
// word names the flag's argument in -h, as the flag package names those of its own types.
func checkedVar[T any](s *Set, p *T, name, env string, def T, text, rule string, parse func(string) (T, error), check func(T) error) {
	if v := s.getenv(env); v != "" {
		x, err := parse(v)
		if err == nil {
			err = check(x)
		}
		if err != nil {
			s.errs = append(s.errs, envErr(env, v, name, err))
		} else {
			def = x
		}
	}
	*p = def
	if strings.Contains(text, "`") { // the text names the argument itself
		rule = strings.ReplaceAll(rule, "`", "")
	}
	text += " (" + rule + ")"
	s.fs.Var(checkedValue[T]{p, parse, check}, name, usage(text, env))
}

// checkedValue is the flag.Value of checkedVar.
type checkedValue[T any] struct {
	p     *T
	parse func(string) (T, error)
	check func(T) error
}

func (v checkedValue[T]) String() string {
	if v.p == nil { // the flag package's zero value, to tell whether a default is worth printing
		return fmt.Sprint(*new(T))
	}
	return fmt.Sprint(*v.p)
}

func (v checkedValue[T]) Set(s string) error {
	x, err := v.parse(s)
	if err == nil {
		err = v.check(x)
	}
	if err != nil {
		return err
	}
	*v.p = x
	return nil
}

// ParseNone parses args like Parse for a command that takes no positional arguments. Its error
// for one names the first only: what follows it may be flags, a NATS password among them, that
// are read all the same rather than printed into a log. A boolean flag given its value apart
// (--setup-streams false) leaves that value as an argument: the error says how to give it.
func ParseNone(fs *flag.FlagSet, args []string) error {
	rest, err := Parse(fs, args)
	if err != nil || len(rest) == 0 {
		return err
	}
	for i := 1; i < len(args); i++ {
		if args[i] != rest[0] {
			continue
		}
		if _, err := strconv.ParseBool(args[i]); err != nil {
			break
		}
		if f := fs.Lookup(strings.TrimLeft(args[i-1], "-")); f != nil && strings.HasPrefix(args[i-1], "-") {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				return fmt.Errorf("unexpected argument %q: a boolean flag takes its value after =, as in --%s=%s", rest[0], f.Name, rest[0])
			}
		}
	}
	return fmt.Errorf("unexpected argument %q (this command takes only flags)", rest[0])
}

// Parse parses args like fs.Parse but lets flags follow the positional arguments, as in
// `submit prompts.jsonl -o results.jsonl`; "--" ends the flags. It returns the positional
// arguments in order.
func Parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		// The flag package stops after a "--" and takes it away: what follows is positional,
		// flag-like or not.
		if endedAtDoubleDash(fs, args[:len(args)-len(rest)]) {
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

package envflag

import (
	"flag"
	"fmt"
	"strconv"
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
		n, err := strconv.Atoi(v)
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: not an integer", env, v))
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
			s.errs = append(s.errs, fmt.Errorf("%s=%q: not a boolean", env, v))
		} else {
			def = b
		}
	}
	s.fs.BoolVar(p, name, def, usage(text, env))
}

// Duration defines a duration flag defaulting to env, or def.
func (s *Set) Duration(p *time.Duration, name, env string, def time.Duration, text string) {
	if v := s.getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: not a duration such as 30s", env, v))
		} else {
			def = d
		}
	}
	s.fs.DurationVar(p, name, def, usage(text, env))
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
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		if args[0] == "--" {
			return append(positional, args[1:]...), nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

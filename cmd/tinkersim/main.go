// Command tinkersim runs the simulated Tinker sampling service of internal/tinkersim on a TCP
// address, for local runs of the worker fleet, demos and benchmarks.
//
//	go run ./cmd/tinkersim -addr 127.0.0.1:8765 -api-key tml-dev -capacity 32 \
//	    -base-latency 200ms -per-token-latency 2ms -fault kind=429,start=30s,duration=10s
//
// Point a client at http://127.0.0.1:8765 (or at http://127.0.0.1:8765/services/tinker-prod:
// any path prefix before /api/v1/ is accepted). API keys come from -api-key (repeatable) and the
// comma-separated env TINKERSIM_API_KEYS; the admin endpoints (/admin/faults, /admin/stats,
// /admin/reset, /admin/forget_sessions, /admin/api_keys) take -admin-token / TINKERSIM_ADMIN_TOKEN in
// X-Admin-Token, or an API key when no admin token is set. With -tls-cert FILE -tls-key FILE it
// serves HTTPS with that PEM key pair instead, HTTP/2 offered by ALPN like the real service
// (§1.4). With -jwt-auth the API wants a JWT from POST /api/v1/auth/token instead of the API key
// (§2.2; -jwt-lifetime sets its validity). Run with -h for every flag. SIGINT, SIGTERM or SIGHUP shut it
// down gracefully (held long polls answer 408 try_again).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
	"github.com/tinkerfleet/tinkerfleet/internal/interrupt"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

func main() {
	ctx, stop := interrupt.Context(context.Background())
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "tinkersim:", err)
		os.Exit(2)
	}
}

// listFlag is a repeatable string flag that also splits on commas.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// secretList is a listFlag whose value is never printed (API keys, §Security).
type secretList struct{ listFlag }

func (s *secretList) String() string {
	if s == nil || len(s.listFlag) == 0 {
		return ""
	}
	return fmt.Sprintf("<%d keys>", len(s.listFlag))
}

// rawList is a repeatable flag that does not split on commas (fault specs contain commas).
type rawList []string

func (l *rawList) String() string { return strings.Join(*l, " ; ") }

func (l *rawList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// options are the parsed command line.
type options struct {
	addr            string
	tlsCert, tlsKey string
	shutdownTimeout time.Duration
	logLevel        string
	cfg             tinkersim.Config
}

// parseFlags reads args and the environment into options.
func parseFlags(args []string, getenv func(string) string, out io.Writer) (*options, error) {
	fs := flag.NewFlagSet("tinkersim", flag.ContinueOnError)
	fs.SetOutput(out)
	o := &options{}
	c := &o.cfg
	var keys secretList
	var models listFlag
	var faults rawList
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8765", "TCP address to listen on (host:port; port 0 picks a free one)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate (chain) file: serve HTTPS, HTTP/2 offered, instead of HTTP; needs -tls-key")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key file of -tls-cert")
	fs.Var(&keys, "api-key", "accepted X-API-Key (must start with tml-); repeatable or comma-separated; also env TINKERSIM_API_KEYS. None: any tml- key is accepted")
	fs.StringVar(&c.AdminToken, "admin-token", "", "token for the X-Admin-Token header of /admin/ endpoints (also env TINKERSIM_ADMIN_TOKEN); empty: admin accepts the API keys")
	fs.IntVar(&c.Capacity, "capacity", 64, "samples the backend runs at once; beyond it asample with X-Tinker-Sampling-Backpressure: 1 gets 429")
	fs.DurationVar(&c.BaseLatency, "base-latency", 200*time.Millisecond, "time per sample before its first token")
	fs.DurationVar(&c.PerTokenLatency, "per-token-latency", 2*time.Millisecond, "time per generated token (of the longest sequence)")
	fs.DurationVar(&c.LongPollWait, "long-poll-wait", 25*time.Second, "how long retrieve_future holds a poll before 408 try_again (keep below 45s)")
	fs.DurationVar(&c.RetryAfter, "retry-after", time.Second, "Retry-After of 429 replies")
	fs.DurationVar(&c.ResultTTL, "result-ttl", 10*time.Minute, "how long finished futures are kept before they answer 410")
	fs.DurationVar(&c.ReadTTL, "read-ttl", 30*time.Second, "how long a finished future is kept once its result was answered (at most -result-ttl)")
	fs.DurationVar(&c.SessionTimeout, "session-timeout", 0, "forget a session (and its samplers: 404) after this long without a heartbeat (§3.4; the SDK heartbeats every 10s and warns after 120s without one); 0: never")
	fs.Var(&models, "model", "served model as name=max_context_length; repeatable (default: Qwen/Qwen3-8B=32768, Qwen/Qwen3-30B-A3B=32768, meta-llama/Llama-3.1-8B-Instruct=131072, meta-llama/Llama-3.2-1B=131072, openai/gpt-oss-20b=131072)")
	fs.Int64Var(&c.Seed, "seed", 1, "seed of the fault-rate RNG and of the synthetic REST data (outputs depend only on the request)")
	fs.IntVar(&c.MinGenTokens, "min-gen-tokens", 1, "shortest natural sequence length")
	tokenMin := fs.Int("token-min", 1000, "smallest generated token id")
	tokenMax := fs.Int("token-max", 100000, "generated token ids are below this")
	fs.Float64Var(&c.StopTokenProbability, "stop-token-prob", 0.05, "chance per generated token of emitting one of the request's stop token ids (0 or negative: only at the natural end)")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", 64, "max_tokens when a request omits it")
	fs.IntVar(&c.MaxNumSamples, "max-num-samples", 128, "largest accepted num_samples")
	fs.IntVar(&c.MetadataOnlyThreshold, "metadata-threshold", 0, "results with a larger protobuf are first announced as complete_metadata (0: never)")
	fs.BoolVar(&c.DisableDynamicConfig, "no-dynamic-config", false, "answer 404 to client/dynamic_config")
	fs.BoolVar(&c.JWTAuth, "jwt-auth", false, "JWT exchange (§2.2): client/config says pjwt_auth_enabled, POST auth/token swaps an API key for a JWT, and every other API endpoint requires that JWT in X-API-Key")
	fs.DurationVar(&c.JWTLifetime, "jwt-lifetime", time.Hour, "validity of the JWTs minted with -jwt-auth")
	clientConfig := fs.String("client-config", "", `JSON object of client/config flags (§3.1) replacing or adding to the defaults, e.g. {"billing_exception_max_pause_duration_sec": 60}: a 402 fault (-fault kind=402) then outlasts the client's billing window (§2.3) within a minute, not an hour`)
	fs.IntVar(&c.TrainingRuns, "training-runs", 3, "synthetic training runs listed by the REST endpoints (0 or negative: none)")
	fs.Var(&faults, "fault", "inject a fault at start; repeatable. Comma-separated key=value: kind (429|5xx|408|try_again_200|410|402|paused_capacity|paused_rate_limit|never_complete|failed|bare_400|drop|slow_heartbeat|slow_accept|401|403), rate, count (at most so many hits), start (delay), duration, reason (last), category, status, delay, retry_after, should_retry (true|false: an x-should-retry header on the reply), endpoints (a+b). E.g. kind=429,start=30s,duration=10s; kind=drop,endpoints=auth/token,duration=2m (a JWT exchange outage)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "grace period for in-flight requests on SIGINT, SIGTERM or SIGHUP")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug (a line per request), info, warn, error")
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: tinkersim [flags]\n\nA wire-compatible simulator of the Tinker sampling API (see internal/tinkersim).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	// The flags after a stray argument are read, not printed back in the error: an admin
	// token or API keys may be among them.
	if err := envflag.ParseNone(fs, args); err != nil {
		return nil, fmt.Errorf("parse flags: %w", err)
	}
	if err := zeroesGiven(fs, c); err != nil {
		return nil, err
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, errors.New("-tls-cert and -tls-key go together: give both or neither")
	}
	if env := getenv("TINKERSIM_API_KEYS"); env != "" {
		if err := keys.Set(env); err != nil {
			return nil, fmt.Errorf("TINKERSIM_API_KEYS: %w", err)
		}
	}
	c.APIKeys = keys.listFlag
	if c.AdminToken == "" {
		c.AdminToken = getenv("TINKERSIM_ADMIN_TOKEN")
	}
	if *tokenMin < 0 || *tokenMax <= *tokenMin || *tokenMax > math.MaxInt32 {
		return nil, fmt.Errorf("-token-min %d -token-max %d: the range of token ids is empty or out of bounds", *tokenMin, *tokenMax)
	}
	c.TokenMin, c.TokenMax = int32(*tokenMin), int32(*tokenMax)
	for _, m := range models {
		name, ctxLen, ok := strings.Cut(m, "=")
		n, err := strconv.Atoi(ctxLen)
		if !ok || err != nil || name == "" {
			return nil, fmt.Errorf("-model %q: want name=max_context_length", m)
		}
		c.Models = append(c.Models, tinkersim.Model{Name: name, MaxContextLength: n})
	}
	if *clientConfig != "" {
		dec := json.NewDecoder(strings.NewReader(*clientConfig))
		dec.UseNumber()
		if err := dec.Decode(&c.ClientConfig); err != nil || c.ClientConfig == nil || dec.More() {
			return nil, fmt.Errorf("-client-config %q: want one JSON object", *clientConfig)
		}
	}
	now := time.Now()
	for _, spec := range faults {
		f, err := tinkersim.ParseFault(spec, now)
		if err != nil {
			return nil, fmt.Errorf("-fault: %w", err)
		}
		c.Faults = append(c.Faults, f)
	}
	return o, nil
}

// zeroesGiven deals with values given on the command line that the Config would replace by
// its default: -stop-token-prob 0 asks for no random stop token and -training-runs 0 for no
// runs, what their negative values mean; a flag that must be positive and is given 0 or less
// is refused, rather than quietly run with the default.
func zeroesGiven(fs *flag.FlagSet, c *tinkersim.Config) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err != nil {
			return
		}
		switch f.Name {
		case "stop-token-prob":
			if sign(f.Value) == 0 {
				c.StopTokenProbability = -1
			}
		case "training-runs":
			if sign(f.Value) == 0 {
				c.TrainingRuns = -1
			}
		case "capacity", "min-gen-tokens", "default-max-tokens", "max-num-samples", "long-poll-wait",
			"retry-after", "result-ttl", "read-ttl", "jwt-lifetime", "shutdown-timeout":
			if sign(f.Value) <= 0 {
				err = fmt.Errorf("-%s %s: give a positive value (the default is %s)", f.Name, f.Value, f.DefValue)
			}
		}
	})
	return err
}

// sign is -1, 0 or 1 as v's number is negative, 0 or positive (1 for anything else).
func sign(v flag.Value) int {
	g, ok := v.(flag.Getter)
	if !ok {
		return 1
	}
	var x float64
	switch n := g.Get().(type) {
	case int:
		x = float64(n)
	case time.Duration:
		x = float64(n)
	case float64:
		x = n
	default:
		return 1
	}
	switch {
	case x < 0:
		return -1
	case x == 0:
		return 0
	}
	return 1
}

// listen serves sim on o.addr, over HTTPS with the key pair of -tls-cert and -tls-key when
// they are set, and returns the base URL.
func listen(ctx context.Context, sim *tinkersim.Server, o *options) (string, error) {
	if o.tlsCert == "" {
		return sim.Listen(ctx, o.addr)
	}
	cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
	if err != nil {
		return "", fmt.Errorf("load -tls-cert/-tls-key: %w", err)
	}
	return sim.ListenTLSWithCert(ctx, o.addr, cert)
}

// run starts the simulator and serves until ctx is done.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	o.cfg.Logger = log
	sim, err := tinkersim.New(o.cfg)
	if err != nil {
		return fmt.Errorf("start simulator: %w", err)
	}
	serveCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	base, err := listen(serveCtx, sim, o)
	if err != nil {
		sim.Close()
		return fmt.Errorf("start simulator: %w", err)
	}
	cfg := sim.Config()
	models := make([]string, 0, len(cfg.Models))
	for _, m := range cfg.Models {
		models = append(models, m.Name)
	}
	// The keys themselves are never logged, only how many there are.
	attrs := []any{"url", base, "api", base + "/api/v1/", "admin", base + "/admin/",
		"api_keys", len(cfg.APIKeys), "capacity", cfg.Capacity, "base_latency", cfg.BaseLatency,
		"per_token_latency", cfg.PerTokenLatency, "long_poll_wait", cfg.LongPollWait, "models", strings.Join(models, ","),
		"faults", len(cfg.Faults)}
	if cfg.JWTAuth {
		attrs = append(attrs, "jwt_auth", true, "jwt_lifetime", cfg.JWTLifetime)
	}
	log.Info("tinkersim listening", attrs...)
	<-ctx.Done()
	log.Info("tinkersim shutting down", "grace", o.shutdownTimeout)
	sctx, scancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer scancel()
	if err := sim.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	st := sim.Stats()
	log.Info("tinkersim stopped", "samples_accepted", st.SamplesAccepted, "samples_completed", st.SamplesCompleted,
		"peak_concurrent", st.PeakConcurrent)
	return nil
}

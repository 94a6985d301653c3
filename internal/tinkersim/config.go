package tinkersim

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Model is a base model the simulator serves (§3.8 get_server_capabilities).
type Model struct {
	// Name is the model name clients pass as base_model, e.g. "Qwen/Qwen3-8B".
	Name string
	// MaxContextLength bounds prompt length plus max_tokens; a request beyond it ends in a
	// failed future with category "user".
	MaxContextLength int
}

// DefaultModels returns the models served when Config.Models is empty.
func DefaultModels() []Model {
	return []Model{
		{Name: "Qwen/Qwen3-8B", MaxContextLength: 32768},
		{Name: "Qwen/Qwen3-30B-A3B", MaxContextLength: 32768},
		{Name: "meta-llama/Llama-3.1-8B-Instruct", MaxContextLength: 131072},
		{Name: "meta-llama/Llama-3.2-1B", MaxContextLength: 131072},
		{Name: "openai/gpt-oss-20b", MaxContextLength: 131072},
	}
}

// MaxTopK is the largest topk_prompt_logprobs the service computes; larger requests are capped.
const MaxTopK = 20

// Config configures a Server. The zero value is usable: every zero field takes the default
// named in its comment, except the latencies, where zero means "instant".
type Config struct {
	// APIKeys are the accepted X-API-Key values; each must start with "tml-". When empty, any
	// key starting with "tml-" is accepted.
	APIKeys []string
	// AdminToken, when set, is required in the X-Admin-Token header of /admin/ requests; when
	// empty, admin requests authenticate with a valid X-API-Key like the API.
	AdminToken string
	// Capacity is the number of samples (asample requests, whatever their num_samples) the
	// backend runs at once; default 64.
	Capacity int
	// BaseLatency is the time a sample takes before its first token; zero means instant.
	BaseLatency time.Duration
	// PerTokenLatency is added per generated token of the longest sequence of a sample.
	PerTokenLatency time.Duration
	// LongPollWait is how long retrieve_future holds a poll before answering 408 try_again;
	// default 25 s (well below the SDK's 45 s poll timeout, §12).
	LongPollWait time.Duration
	// RetryAfter is the Retry-After of a 429 (capacity or injected); default 1 s.
	RetryAfter time.Duration
	// ResultTTL is how long a finished future is kept; afterwards it answers 410. Default 10 min.
	ResultTTL time.Duration
	// ReadTTL is how long a finished future is kept once its outcome has been answered in full:
	// long enough for a client that lost that reply to poll again, short enough that a long run
	// does not hold every result it ever served. Default 30 s, never more than ResultTTL.
	ReadTTL time.Duration
	// Models are the served base models; default DefaultModels().
	Models []Model
	// Seed seeds the fault-injection RNG (rates) and the synthetic REST data. Sampled outputs
	// do not depend on it: they depend only on the request (prompt, seed, sample index).
	// Session and request ids do not either: they are random on every start.
	Seed int64
	// MinGenTokens is the shortest natural sequence length; default 1.
	MinGenTokens int
	// TokenMin and TokenMax bound generated token ids to [TokenMin, TokenMax); default
	// [1000, 100000), ordinary text in Qwen3 and Llama 3 vocabularies.
	TokenMin, TokenMax int32
	// StopTokenProbability is the chance that a generated token is one of the request's stop
	// token ids; default 0.05. Negative means never (only the natural end emits one).
	StopTokenProbability float64
	// DefaultMaxTokens is used when sampling_params.max_tokens is absent; default 64.
	DefaultMaxTokens int
	// MaxNumSamples bounds num_samples; default 128.
	MaxNumSamples int
	// MetadataOnlyThreshold: when > 0, a result whose protobuf is larger is first announced
	// with {"status":"complete_metadata"} to polls that allow it (§4.4). Default 0: never.
	MetadataOnlyThreshold int
	// SessionTimeout, when positive, expires a session that has gone this long without a
	// heartbeat (counted from its creation until the first): the service forgets it and its
	// sampling sessions, so session_heartbeat, create_sampling_session, asample and GET
	// samplers/{id} or sessions/{id} naming them answer 404, as after ForgetSessions; futures
	// already accepted can still be polled. The wire doc says the service presumably expires
	// sessions without heartbeats but gives no figure (§3.4); the SDK warns once 120 s passed
	// without a successful heartbeat. Default 0: sessions never expire.
	SessionTimeout time.Duration
	// DisableDynamicConfig makes client/dynamic_config answer 404 (the SDK then uses defaults).
	DisableDynamicConfig bool
	// JWTAuth turns on the JWT exchange (§2.2): client/config answers pjwt_auth_enabled true,
	// POST auth/token exchanges an accepted API key (or a JWT of its own) for a JWT (HS256
	// under a per-server random secret, claims sub, email, iat, exp), and every API endpoint
	// except client/config and auth/token then requires such a JWT, unexpired, in X-API-Key
	// (401 otherwise, a plain API key included). Admin endpoints keep taking X-Admin-Token or
	// an API key.
	JWTAuth bool
	// JWTLifetime is how long a minted JWT is valid; exp is rounded up to a whole second, so a
	// token lives at least this long. Default 1 h.
	JWTLifetime time.Duration
	// ClientConfig overrides or adds fields of the client/config reply (§3.1), pjwt_auth_enabled
	// included (which then no longer follows JWTAuth).
	ClientConfig map[string]any
	// TrainingRuns is the number of synthetic training runs served by the REST listing
	// endpoints (§3.14), each with two checkpoints; default 3, negative means none.
	TrainingRuns int
	// MaxBodyBytes bounds request bodies; default 64 MiB.
	MaxBodyBytes int64
	// Faults are injected at start, as if passed to Inject.
	Faults []Fault
	// Logger receives a debug line per request (method, path, endpoint, status, duration; a
	// dropped request has status 0) and errors of the listeners; nil discards them. API keys
	// are never logged.
	Logger *slog.Logger
}

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	if err := checkAPIKeys(c.APIKeys); err != nil {
		return c, err
	}
	if c.Capacity < 0 {
		return c, errors.New("capacity must not be negative")
	}
	if c.Capacity == 0 {
		c.Capacity = 64
	}
	if c.BaseLatency < 0 || c.PerTokenLatency < 0 || c.LongPollWait < 0 || c.RetryAfter < 0 || c.ResultTTL < 0 ||
		c.ReadTTL < 0 || c.JWTLifetime < 0 || c.SessionTimeout < 0 {
		return c, errors.New("durations must not be negative")
	}
	if c.JWTLifetime == 0 {
		c.JWTLifetime = time.Hour
	}
	if c.LongPollWait == 0 {
		c.LongPollWait = 25 * time.Second
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = time.Second
	}
	if c.ResultTTL == 0 {
		c.ResultTTL = 10 * time.Minute
	}
	if c.ReadTTL == 0 {
		c.ReadTTL = 30 * time.Second
	}
	c.ReadTTL = min(c.ReadTTL, c.ResultTTL)
	if len(c.Models) == 0 {
		c.Models = DefaultModels()
	}
	seen := map[string]bool{}
	for _, m := range c.Models {
		if m.Name == "" || m.MaxContextLength <= 0 {
			return c, fmt.Errorf("model %q: needs a name and a positive max context length", m.Name)
		}
		if seen[m.Name] {
			return c, fmt.Errorf("model %q listed twice", m.Name)
		}
		seen[m.Name] = true
	}
	if c.MinGenTokens <= 0 {
		c.MinGenTokens = 1
	}
	if c.TokenMin == 0 && c.TokenMax == 0 {
		c.TokenMin, c.TokenMax = 1000, 100000
	}
	if c.TokenMin < 0 || c.TokenMax <= c.TokenMin {
		return c, fmt.Errorf("token range [%d, %d) is empty or negative", c.TokenMin, c.TokenMax)
	}
	if c.StopTokenProbability == 0 {
		c.StopTokenProbability = 0.05
	}
	if c.StopTokenProbability > 1 {
		return c, errors.New("stop token probability must be at most 1")
	}
	if c.DefaultMaxTokens <= 0 {
		c.DefaultMaxTokens = 64
	}
	if c.MaxNumSamples <= 0 {
		c.MaxNumSamples = 128
	}
	if c.TrainingRuns == 0 {
		c.TrainingRuns = 3
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 64 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// checkAPIKeys checks that each key starts with "tml-" and is not empty after it.
func checkAPIKeys(keys []string) error {
	for i, k := range keys {
		if !strings.HasPrefix(k, "tml-") || len(k) <= len("tml-") {
			return fmt.Errorf("api key #%d: must start with \"tml-\" and not be empty after it", i+1)
		}
	}
	return nil
}

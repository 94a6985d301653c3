package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Errors a Registry wraps so callers can tell a missing tokenizer from a
// refused or an unusable one.
var (
	// ErrNotFound means the hub has no such repository or file (HTTP 404),
	// or the tokenizer is not available locally while offline.
	ErrNotFound = errors.New("tokenizer not found")
	// ErrUnauthorized means the hub refused the download (HTTP 401/403): the repository is
	// gated or private and HF_TOKEN is missing or lacks access; or the host the hub redirected
	// the download to (its CDN) refused it.
	ErrUnauthorized = errors.New("tokenizer download unauthorized")
	// ErrUnsupported means the tokenizer's files were found but cannot be used: they are not
	// a tokenizer.json, or one this package would not reproduce exactly (Parse). They are the
	// same files on every try.
	ErrUnsupported = errors.New("tokenizer not supported")
)

// DefaultEndpoint is the HuggingFace hub used when Options.Endpoint is empty.
const DefaultEndpoint = "https://huggingface.co"

// Options says where a Registry finds tokenizer files.
type Options struct {
	// Dir is a local override (env TINKERFLEET_TOKENIZER_DIR): either a
	// tokenizer.json (or .zst) used for every model, or a directory with one
	// subdirectory per tokenizer id ("Qwen/Qwen3-8B" or "Qwen--Qwen3-8B"),
	// or a directory holding tokenizer.json itself.
	Dir string
	// HFHome is the HuggingFace home (env HF_HOME); the cache is HFHome/hub
	// unless HubCache names another. Empty, with HubCache, disables the cache
	// and downloads.
	HFHome string
	// HubCache is the hub cache (env HF_HUB_CACHE, or the older
	// HUGGINGFACE_HUB_CACHE), as huggingface_hub reads it; empty means
	// HFHome/hub.
	HubCache string
	// Endpoint is the hub (env HF_ENDPOINT); DefaultEndpoint when empty.
	Endpoint string
	// Token is sent as "Authorization: Bearer" (env HF_TOKEN, else
	// HUGGING_FACE_HUB_TOKEN, else the token file). It never appears in errors or logs.
	Token string
	// TokenVar is the environment variable OptionsFromEnv read Token from (HF_TOKEN or
	// HUGGING_FACE_HUB_TOKEN), which a refused download names; empty means HF_TOKEN.
	TokenVar string
	// TokenFile is the token file OptionsFromEnv read Token from, or looked
	// for without finding one (env HF_TOKEN_PATH, default HFHome/token, where
	// `huggingface-cli login` writes it); empty when Token came from TokenVar.
	// A refused download names it.
	TokenFile string
	// Offline forbids downloads (env HF_HUB_OFFLINE=1).
	Offline bool
	// Logger receives the registry's warnings (a tokenizer downloaded but not cached); nil
	// discards them.
	Logger *slog.Logger
	// HTTPClient is used for downloads; http.DefaultClient's transport when nil. Whatever
	// the client, a download is given up after stallTimeout without a byte from the hub,
	// however long it has run.
	HTTPClient *http.Client
}

// OptionsFromEnv reads TINKERFLEET_TOKENIZER_DIR, HF_HOME (default
// $XDG_CACHE_HOME/huggingface or $HOME/.cache/huggingface), HF_HUB_CACHE
// (or HUGGINGFACE_HUB_CACHE), HF_ENDPOINT,
// HF_TOKEN (or, unset or empty, the older HUGGING_FACE_HUB_TOKEN, as huggingface_hub reads
// them) and HF_HUB_OFFLINE through getenv (normally os.Getenv). Without
// a token there, it is read from the file huggingface_hub reads it from:
// HF_TOKEN_PATH, default $HF_HOME/token (a Kubernetes secret mounted as a
// file, or `huggingface-cli login`'s); a missing file means no token. Either is
// cleaned as huggingface_hub cleans it (cleanToken).
func OptionsFromEnv(getenv func(string) string) Options {
	o := Options{
		Dir:      getenv("TINKERFLEET_TOKENIZER_DIR"),
		HFHome:   getenv("HF_HOME"),
		HubCache: getenv("HF_HUB_CACHE"),
		Endpoint: getenv("HF_ENDPOINT"),
		TokenVar: "HF_TOKEN",
	}
	token := getenv("HF_TOKEN")
	if token == "" { // huggingface_hub: HF_TOKEN or HUGGING_FACE_HUB_TOKEN, then cleaned
		token, o.TokenVar = getenv("HUGGING_FACE_HUB_TOKEN"), "HUGGING_FACE_HUB_TOKEN"
	}
	o.Token = cleanToken(token)
	if o.HubCache == "" {
		o.HubCache = getenv("HUGGINGFACE_HUB_CACHE")
	}
	switch strings.ToLower(getenv("HF_HUB_OFFLINE")) {
	case "1", "true", "yes", "on":
		o.Offline = true
	}
	if o.HFHome == "" {
		if x := getenv("XDG_CACHE_HOME"); x != "" {
			o.HFHome = filepath.Join(x, "huggingface")
		} else if h := getenv("HOME"); h != "" {
			o.HFHome = filepath.Join(h, ".cache", "huggingface")
		}
	}
	if o.Token == "" {
		o.TokenVar = ""
		o.TokenFile = getenv("HF_TOKEN_PATH")
		if o.TokenFile == "" && o.HFHome != "" {
			o.TokenFile = filepath.Join(o.HFHome, "token")
		}
		if o.TokenFile != "" {
			o.Token = readTokenFile(o.TokenFile)
		}
	}
	return o
}

// maxTokenFile bounds the token file read: a HuggingFace token is 37 bytes.
const maxTokenFile = 4 << 10

// readTokenFile returns the token in file path, trimmed of white space as
// huggingface_hub trims it, or "" if there is none to read.
func readTokenFile(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil || len(data) > maxTokenFile {
		return ""
	}
	return cleanToken(string(data))
}

// cleanToken is a token as huggingface_hub reads it from HF_TOKEN, HUGGING_FACE_HUB_TOKEN or
// the token file (_clean_token): without line breaks, nor the white space around it. A secret
// handed to a container as an environment variable often keeps the newline of the file it was
// made from, which net/http refuses in a header: every download failed. "" (only white space)
// is none.
func cleanToken(s string) string {
	return strings.TrimSpace(strings.NewReplacer("\r", "", "\n", "").Replace(s))
}

// CheckDir returns an error naming dir, an Options.Dir, if it is set but cannot be found. A
// Registry looks in it for every tokenizer and goes on to the HF cache and the hub when a
// tokenizer is not there, so that a mistyped path was passed over without a word: programs
// check it at start-up.
func CheckDir(dir string) error {
	if dir == "" {
		return nil
	}
	if _, err := os.Stat(dir); err != nil {
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			err = pe.Err // its text repeats the path
		}
		return fmt.Errorf("%q: %w", dir, err)
	}
	return nil
}

// TokenizerID maps a model name to the HuggingFace repository of its
// tokenizer with the heuristic of §9: drop everything after the first ':',
// send Llama 3 models to thinkingmachineslabinc/meta-llama-3-instruct-tokenizer
// (no HF gating), and cut "org/model/variant" to "org/model".
func TokenizerID(model string) string {
	if i := strings.IndexByte(model, ':'); i >= 0 {
		model = model[:i]
	}
	if strings.HasPrefix(model, "meta-llama/Llama-3") {
		return "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"
	}
	if strings.Count(model, "/") == 2 {
		return model[:strings.LastIndexByte(model, '/')]
	}
	return model
}

// Registry finds, loads and keeps tokenizers, one per tokenizer id for the
// life of the process. Concurrent requests for the same id share one load.
// A failed load answers for failedLoadMemory, then a later call tries again; a load that
// panics fails so, with the panic named, and the panic goes on in the request that loaded.
type Registry struct {
	opts    Options
	now     func() time.Time // time.Now; a test's clock
	stall   time.Duration    // stallTimeout; a test's shorter one
	mu      sync.Mutex
	entries map[string]*regEntry
}

type regEntry struct {
	done     chan struct{}
	tok      *Tokenizer
	err      error
	failedAt time.Time // when err came: it answers until failedLoadMemory later
}

// failedLoadMemory is how long a failed load answers for its tokenizer before the next
// request tries again. Every job asks for its model's tokenizer, and a prompt_tokens job goes
// on without one; forgotten at once, a failure had every job start a hub request and wait for
// it, one after another: a fleet whose tokenizer could not be fetched stopped for 1.5-2.3 s
// every few seconds. A job that needs the tokenizer is retried later anyway (the worker's
// retry delay), so a hub back within this is hardly noticed.
const failedLoadMemory = 10 * time.Second

// NewRegistry returns an empty registry using opts.
func NewRegistry(opts Options) *Registry {
	if opts.Endpoint == "" {
		opts.Endpoint = DefaultEndpoint
	}
	opts.Endpoint = strings.TrimRight(opts.Endpoint, "/")
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	opts.HTTPClient = tokenOverTLSOnly(opts.HTTPClient)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Registry{opts: opts, now: time.Now, stall: stallTimeout, entries: map[string]*regEntry{}}
}

// stallTimeout is how long a download waits for the hub's next byte (its answer, a redirect,
// the body's next piece) before it is given up, as huggingface_hub gives up a read after
// HF_HUB_DOWNLOAD_TIMEOUT. A limit on the whole transfer (it was 2 minutes) failed every try of
// a slow but live download (gpt-oss's 27 MB under 1.8 Mbit/s) and kept a hub that hung from
// being given up for as long.
const stallTimeout = 30 * time.Second

// errStalled is the cause of a download given up after stallTimeout without a byte.
var errStalled = errors.New("no data from the hub for the stall timeout")

// stallReader is a download's body that puts its stall timer off at every byte read.
type stallReader struct {
	r     io.Reader
	timer *time.Timer
	stall time.Duration
}

func (s *stallReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.timer.Reset(s.stall)
	}
	return n, err
}

// tokenOverTLSOnly returns a copy of hc that drops the Authorization header (the HF token)
// from a redirect away from https: net/http keeps it for any redirect to the same host or a
// subdomain, whatever the scheme, and would send the token in clear text where huggingface_hub
// (requests) drops it. The download goes on without it, as huggingface_hub's does.
func tokenOverTLSOnly(hc *http.Client) *http.Client {
	kept := *hc
	next := hc.CheckRedirect
	kept.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.URL.Scheme != "https" && slices.ContainsFunc(via, func(r *http.Request) bool { return r.URL.Scheme == "https" }) {
			req.Header.Del("Authorization")
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &kept
}

// ForModel returns the tokenizer of a model name (see TokenizerID).
func (r *Registry) ForModel(ctx context.Context, model string) (*Tokenizer, error) {
	return r.ForID(ctx, TokenizerID(model))
}

// ForID returns the tokenizer of a HuggingFace repository id, loading it on
// first use from Options.Dir, the HF cache, the tokenizers built into the
// program (Qwen3, see Builtin), or the hub.
func (r *Registry) ForID(ctx context.Context, id string) (*Tokenizer, error) {
	r.mu.Lock()
	e, ok := r.entries[id]
	if ok && e.err != nil && r.now().Sub(e.failedAt) >= failedLoadMemory {
		ok = false // a failure long enough ago: try again
	}
	if !ok {
		e = &regEntry{done: make(chan struct{})}
		r.entries[id] = e
		r.mu.Unlock()
		settled := false
		defer func() {
			if settled {
				return
			}
			// The load panicked: its waiters, which would wait for ever, get an error that names
			// the panic, and the panic goes on (the worker turns it into an error result).
			p := recover()
			r.settle(ctx, id, e, nil, fmt.Errorf("tokenizer %s: its load panicked: %v", id, p))
			if p != nil {
				panic(p)
			}
		}()
		tok, err := r.load(ctx, id)
		settled = true
		r.settle(ctx, id, e, tok, err)
		return tok, err
	}
	r.mu.Unlock()
	select {
	case <-e.done:
		return e.tok, e.err
	case <-ctx.Done():
		return nil, fmt.Errorf("tokenizer %s: %w", id, ctx.Err())
	}
}

// settle ends the load of entry e (of tokenizer id, by a request whose context is ctx) with
// tok or err, and wakes its waiters.
func (r *Registry) settle(ctx context.Context, id string, e *regEntry, tok *Tokenizer, err error) {
	r.mu.Lock() // failedAt is read under it, by requests that find e done
	e.tok, e.err = tok, err
	if err != nil {
		if ctx.Err() != nil {
			delete(r.entries, id) // this request's end, not the tokenizer's failure
		}
		e.failedAt = r.now()
	}
	r.mu.Unlock()
	close(e.done)
}

func (r *Registry) load(ctx context.Context, id string) (*Tokenizer, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if p := r.localPath(id); p != "" {
		return Load(p)
	}
	if p := r.cachedPath(id); p != "" {
		return Load(p)
	}
	if tok, ok, err := builtin(id); ok {
		return tok, err
	}
	if strings.HasPrefix(id, "TML/") || strings.HasPrefix(id, "thinkingmachines/") {
		return nil, fmt.Errorf("tokenizer %s is private to Thinking Machines (tml_tokenizers, §9); put it under Options.Dir: %w", id, ErrNotFound)
	}
	if r.hubCache() == "" || r.opts.Offline {
		return nil, fmt.Errorf("tokenizer %s: not in the tokenizer dir or the HF cache, and downloads are off: %w", id, ErrNotFound)
	}
	return r.download(ctx, id)
}

// validID rejects ids that could escape the cache directory.
func validID(id string) error {
	if id == "" || strings.Contains(id, "..") || strings.HasPrefix(id, "/") || strings.ContainsAny(id, `\:`) ||
		strings.Count(id, "/") > 1 {
		return fmt.Errorf("tokenizer id %q is not of the form org/name", id)
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// localPath looks in Options.Dir.
func (r *Registry) localPath(id string) string {
	d := r.opts.Dir
	if d == "" {
		return ""
	}
	fi, err := os.Stat(d)
	if err != nil {
		return ""
	}
	if !fi.IsDir() {
		return d
	}
	for _, sub := range []string{filepath.FromSlash(id), strings.ReplaceAll(id, "/", "--"), "models--" + strings.ReplaceAll(id, "/", "--")} {
		for _, name := range []string{"tokenizer.json", "tokenizer.json.zst"} {
			if p := filepath.Join(d, sub, name); exists(p) {
				return filepath.Dir(p)
			}
		}
	}
	for _, name := range []string{"tokenizer.json", "tokenizer.json.zst"} {
		if exists(filepath.Join(d, name)) {
			return d
		}
	}
	return ""
}

// hubCache is the HF hub cache: Options.HubCache, or HFHome/hub; "" for none.
func (r *Registry) hubCache() string {
	if r.opts.HubCache != "" || r.opts.HFHome == "" {
		return r.opts.HubCache
	}
	return filepath.Join(r.opts.HFHome, "hub")
}

// repoDir is the HF cache directory of a model repository.
func (r *Registry) repoDir(id string) string {
	return filepath.Join(r.hubCache(), "models--"+strings.ReplaceAll(id, "/", "--"))
}

// cachedPath finds tokenizer.json in the HF cache through refs/main.
func (r *Registry) cachedPath(id string) string {
	if r.hubCache() == "" {
		return ""
	}
	repo := r.repoDir(id)
	ref, err := readRef(filepath.Join(repo, "refs", "main"))
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(ref))
	if validRev(rev) != nil {
		return ""
	}
	p := filepath.Join(repo, "snapshots", rev, "tokenizer.json")
	if !exists(p) {
		return ""
	}
	return p
}

// maxRefFile bounds what is read of a refs file of the HF cache: it names a revision (40 hex
// digits, and validRev takes no more than 100 bytes), and a file grown large is not read whole.
const maxRefFile = 4 << 10

// readRef reads the refs file at path, no further than maxRefFile bytes and one more, which
// validRev then refuses.
func readRef(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxRefFile+1))
}

func validRev(rev string) error {
	if rev == "" || len(rev) > 100 || rev == "." || rev == ".." {
		return fmt.Errorf("bad revision %q", rev)
	}
	for _, c := range rev {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("bad revision %q", rev)
		}
	}
	return nil
}

// download fetches tokenizer.json (required) and tokenizer_config.json
// (optional) into the HF cache layout and returns the tokenizer. What does not
// parse as a tokenizer (an error page a proxy answered 200 with, say) is not
// cached: every later load would fail on it, where another download may not.
// The cache is for the next process: a tokenizer that parsed is returned even when
// it cannot be cached (a full disk) or tokenizer_config.json, which no load reads,
// cannot be fetched; refs/main is then not written, so that the next process
// downloads both again.
func (r *Registry) download(ctx context.Context, id string) (*Tokenizer, error) {
	data, rev, err := r.fetch(ctx, id, "tokenizer.json")
	if err != nil {
		return nil, err
	}
	tok, err := parse(data)
	if err != nil {
		if json.Valid(data) { // the hub's file, the same on every try
			err = &unsupportedError{err}
		} // else not the hub's file (a proxy's page, say): another try may get it
		return nil, fmt.Errorf("tokenizer %s: downloaded tokenizer.json: %w", id, err)
	}
	if err := r.cache(ctx, id, rev, data); err != nil {
		r.opts.Logger.Warn("tokenizer downloaded but not cached: the next process downloads it again", "tokenizer", id, "err", err)
	}
	return tok, nil
}

// cache writes the downloaded tokenizer.json (data, of revision rev) and tokenizer_config.json
// into the HF cache layout, refs/main last.
func (r *Registry) cache(ctx context.Context, id, rev string, data []byte) error {
	if validRev(rev) != nil {
		rev = "main"
	}
	snap := filepath.Join(r.repoDir(id), "snapshots", rev)
	if err := writeAtomic(filepath.Join(snap, "tokenizer.json"), data); err != nil {
		return err
	}
	cfg, _, err := r.fetch(ctx, id, "tokenizer_config.json")
	switch {
	case err == nil:
		if err := writeAtomic(filepath.Join(snap, "tokenizer_config.json"), cfg); err != nil {
			return err
		}
	case !errors.Is(err, ErrNotFound):
		return err
	}
	return writeAtomic(filepath.Join(r.repoDir(id), "refs", "main"), []byte(rev))
}

// shownURL is raw as errors show it: without user information (a proxy's endpoint in
// HF_ENDPOINT may carry a password), or not at all if it does not parse.
func shownURL(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "(the HF_ENDPOINT URL, which does not parse)"
	case u.User != nil:
		u.User = url.User("redacted")
	}
	return u.String()
}

// checkEndpoint refuses an HF_ENDPOINT whose user information cannot be read: a password
// holding a '/', '?', '#' or '%' not percent-encoded ends the URL's host there, so that the
// URL does not parse, with an error that quotes it (or the piece of the password it took for
// a port or an escape), or parses with the password's end in its path, which errors show.
func checkEndpoint(endpoint string) error {
	_, rest, _ := strings.Cut(endpoint, "://")
	if !strings.Contains(rest, "@") {
		if _, err := url.Parse(endpoint); err != nil {
			return fmt.Errorf("HF_ENDPOINT %q is not a URL: %w", endpoint, errors.Unwrap(err))
		}
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.User == nil || strings.Contains(u.Path+u.RawQuery+u.Fragment, "@") {
		return errors.New("HF_ENDPOINT: its user information cannot be read: percent-encode a '/', '?', '#' or '%' of a password in the URL (%2F, %3F, %23, %25)")
	}
	return nil
}

// fetch GETs <endpoint>/<id>/resolve/main/<file>; it returns the body and
// the X-Repo-Commit revision, of the answer or of a redirect that led to it.
func (r *Registry) fetch(ctx context.Context, id, file string) ([]byte, string, error) {
	if err := checkEndpoint(r.opts.Endpoint); err != nil {
		return nil, "", fmt.Errorf("download %s/resolve/main/%s: %w", id, file, err)
	}
	full := r.opts.Endpoint + "/" + id + "/resolve/main/" + url.PathEscape(file)
	u := shownURL(full)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := time.AfterFunc(r.stall, func() { cancel(fmt.Errorf("%w (%s)", errStalled, r.stall)) })
	defer stalled.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, full, nil)
	if err != nil {
		return nil, "", fmt.Errorf("download %s: %w", u, err)
	}
	if r.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+r.opts.Token)
	}
	req.Header.Set("User-Agent", "tinkerfleet-tokenizer")
	resp, err := r.opts.HTTPClient.Do(req)
	if err != nil {
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err // its text repeats the method and the URL
		}
		return nil, "", fmt.Errorf("download %s: %w", u, stallCause(ctx, err))
	}
	defer resp.Body.Close()
	// A file in LFS or Xet is a redirect to a CDN, past the hub's check of the token: what the
	// CDN answers is named by its host (only: a signed URL's query is a credential).
	who, redirected := "hub", resp.Request != nil && resp.Request.URL.Host != req.URL.Host
	if redirected {
		who = resp.Request.URL.Host
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, "", fmt.Errorf("download %s: %s answered 404 (no such repository or file): %w", u, who, ErrNotFound)
	case (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) && redirected:
		return nil, "", fmt.Errorf("download %s: %s answered %d to the hub's redirect; the hub accepted the request, so the refusal is that host's (a proxy in the way?): %w",
			u, who, resp.StatusCode, ErrUnauthorized)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		hint := "set HF_TOKEN"
		switch {
		case r.opts.Token != "" && r.opts.TokenFile != "":
			hint = "the token of " + r.opts.TokenFile + " was sent but has no access (gated model? accept its licence on the hub)"
		case r.opts.Token != "":
			name := r.opts.TokenVar
			if name == "" {
				name = "HF_TOKEN"
			}
			hint = name + " was sent but has no access (gated model? accept its licence on the hub)"
		case r.opts.TokenFile != "":
			hint = "set HF_TOKEN, or put a token in " + r.opts.TokenFile
		}
		return nil, "", fmt.Errorf("download %s: hub answered %d; %s: %w", u, resp.StatusCode, hint, ErrUnauthorized)
	case resp.StatusCode != http.StatusOK:
		return nil, "", fmt.Errorf("download %s: %s answered %s", u, who, resp.Status)
	}
	stalled.Reset(r.stall)
	data, err := io.ReadAll(io.LimitReader(&stallReader{r: resp.Body, timer: stalled, stall: r.stall}, maxTokenizerJSON+1))
	if err != nil {
		return nil, "", fmt.Errorf("download %s: %w", u, stallCause(ctx, err))
	}
	if len(data) > maxTokenizerJSON {
		return nil, "", fmt.Errorf("download %s: larger than %d bytes", u, maxTokenizerJSON)
	}
	// A file in LFS or Xet is a redirect to a CDN, whose answer names no commit: the hub's
	// redirect does, as huggingface_hub reads it.
	rev := resp.Header.Get("X-Repo-Commit")
	for q := resp.Request; rev == "" && q != nil && q.Response != nil; q = q.Response.Request {
		rev = q.Response.Header.Get("X-Repo-Commit")
	}
	return data, rev, nil
}

// stallCause is err, or the stall timeout's error if that is what ended ctx (fetch's own).
func stallCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, errStalled) {
		return cause
	}
	return err
}

// staleTemp is the age past which a temporary file of writeAtomic is taken for one that a
// process killed mid-write left behind: a write, from memory, takes well under a second.
const staleTemp = time.Hour

// writeAtomic writes data to path through a temporary file in the same
// directory and a rename, so readers never see a partial file. It first removes the
// temporary files older than staleTemp that processes killed mid-write left in the directory.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	removeStaleTemps(dir)
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// removeStaleTemps removes the temporary files of writeAtomic (".tmp-…") in dir that are older
// than staleTemp. A younger one may be another process's write under way, and is left. It is
// tidying only: what cannot be read or removed is left as it is.
func removeStaleTemps(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTemp {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// ConnectConfig says how to reach and authenticate to a NATS server or cluster. At most one of
// CredsFile, NKeyFile, User/Password and Token is used.
type ConnectConfig struct {
	// URL is a comma-separated list of server URLs.
	URL string
	// Name identifies the connection in the server's monitoring.
	Name string
	// CredsFile is a JWT user credentials file (decentralised auth).
	CredsFile string
	// NKeyFile is a file holding an NKey seed.
	NKeyFile string
	// User and Password authenticate with a user name and password. One line end ("\n" or
	// "\r\n") at the end of Password is no part of it (see secret).
	User, Password string
	// Token authenticates with a token; one line end at its end is no part of it, as for
	// Password.
	Token string
	// TLSCA is a PEM file of CAs that sign the servers' certificates.
	TLSCA string
	// TLSCert and TLSKey are a client certificate and key, for mutual TLS.
	TLSCert, TLSKey string
	// Logger receives disconnect and reconnect events; nil discards them.
	Logger *slog.Logger

	// stillDownEvery is how often a connection that stays down is warned of; zero is
	// defaultStillDownEvery (tests shorten it).
	stillDownEvery time.Duration
	// embedded is set by Plain: the server is on this machine (see embeddedConnectTimeout).
	embedded bool
}

// PingInterval and MaxPingsOut make a connection notice a link that died without closing: a
// node whose network failed, a NAT or firewall that forgot the flow, a cable pulled. The
// client pings its server every PingInterval, and once more than MaxPingsOut pings wait for
// their pong, it drops the connection as stale and reconnects, to another server of a cluster
// if it has one: 20-30 s after the link died. nats.go's defaults (2 minutes, 2) took 4 minutes
// in a measured run, while the worker sampled on and held every result it could not store.
const (
	PingInterval = 10 * time.Second
	MaxPingsOut  = 2
)

// WriteTimeout bounds a write to the server, as the server's own write deadline (10 s by
// default) bounds its writes to a client. On a dead link under load the socket's buffers fill
// within seconds, and a write then waits for room while it holds the connection's lock, which
// the ping timer needs too. nats.go's default lets it wait a minute, and a write that fails
// having written nothing leaves the connection up: a busy worker behind a frozen proxy noticed
// its dead link after 71 s. Now a write gives up after WriteTimeout and closes its socket,
// which drops the connection (see closeOnWriteTimeout).
const WriteTimeout = 10 * time.Second

// Plain returns c for an embedded server (StartEmbedded), which asks for no credentials and
// serves no TLS: without them. A fleet's NATS settings left in the environment (NATS_TLS_CA,
// say) then do not fail a local run ("secure connection not available"). Its connection is
// given embeddedConnectTimeout to open.
func (c ConnectConfig) Plain() ConnectConfig {
	return ConnectConfig{URL: c.URL, Name: c.Name, Logger: c.Logger, embedded: true}
}

// embeddedConnectTimeout bounds the opening of a connection to an embedded server, this
// process's or another's on this machine, in place of nats.go's 2 s: a server that slow to
// greet is on a machine under load, not gone (a refused dial still fails at once). At a load
// average of about 20, `submit --local` failed with "i/o timeout" before its own server's
// greeting.
const embeddedConnectTimeout = 15 * time.Second

// Connect dials NATS with the given credentials and TLS, reconnecting forever after a drop (a
// worker outlives server restarts). extra options are applied last. It fails at once when no
// server answers; ConnectWait waits for one.
func Connect(cfg ConnectConfig, extra ...nats.Option) (*nats.Conn, error) {
	if cfg.URL == "" {
		return nil, errors.New("nats: no server URL")
	}
	if err := checkURLs(cfg.URL); err != nil {
		return nil, err
	}
	log := logger(cfg)
	// The reconnect is a warning too, with the outage's length: a reader that was told of the
	// disconnect (submit shows only warnings) learns that it ended. nats.go calls both handlers
	// from one goroutine, in order.
	var down time.Time
	// back is closed when the connection is back from its drop, dropped again, or closed: it
	// ends that drop's warnWhileDown. Only the handlers touch it.
	var back chan struct{}
	endDrop := func() {
		if back != nil {
			close(back)
			back = nil
		}
	}
	every := cmp.Or(cfg.stillDownEvery, defaultStillDownEvery)
	// refusalWarned is whether a refusal of the credentials was warned of since the last drop:
	// the first is, at once, and then warnWhileDown's warning says it every interval. Only the
	// handlers touch it.
	var refusalWarned bool
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		// nats.go gives up, closing the connection for good, when a server refuses the
		// credentials twice in a row on reconnect (its password rotated before the clients',
		// accounts that load late after a restart): a worker then sampled nothing until it was
		// restarted, and lost the results it held. It keeps trying, as after any drop.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			down = time.Now()
			if err == nil {
				return // Close: nats.go reports its own close as a disconnect without an error
			}
			log.Warn("nats disconnected", "err", err)
			refusalWarned = false
			endDrop()
			back = make(chan struct{})
			go warnWhileDown(nc, log, every, down, back)
		}),
		nats.ClosedHandler(func(*nats.Conn) { endDrop() }),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			endDrop()
			log.Warn("nats reconnected", "url", nc.ConnectedUrlRedacted(), "after", time.Since(down).Round(time.Millisecond))
		}),
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOut),
		nats.FlusherTimeout(WriteTimeout),
		nats.ReconnectOnFlusherError(),
		nats.ErrorHandler(asyncErrorLogger(log, &refusalWarned)),
	}
	auth := 0
	if cfg.CredsFile != "" {
		auth++
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeyFile != "" {
		auth++
		opt, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats: nkey seed file %s: %w", cfg.NKeyFile, err)
		}
		opts = append(opts, opt)
	}
	if cfg.User != "" || cfg.Password != "" {
		auth++
		opts = append(opts, nats.UserInfo(cfg.User, secret(cfg.Password)))
	}
	if cfg.Token != "" {
		auth++
		opts = append(opts, nats.Token(secret(cfg.Token)))
	}
	if urlHasCredentials(cfg.URL) {
		// nats.go takes them over any of the others, silently: a --nats-password beside
		// them was ignored.
		auth++
	}
	if auth > 1 {
		return nil, errors.New("nats: give one of credentials file, nkey, user/password or token (a user or token in the server URL counts as one)")
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return nil, errors.New("nats: a TLS client certificate needs both a certificate and a key file")
	}
	if cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	if cfg.embedded {
		opts = append(opts, nats.Timeout(embeddedConnectTimeout))
	}
	opts = append(opts, extra...)
	opts = append(opts, closeOnWriteTimeout) // last: it wraps the dialer the others chose
	nc, err := nats.Connect(cfg.URL, opts...)
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		// Its text quotes the URL, with any password in it: say only what is wrong.
		return nil, fmt.Errorf("connect to NATS at %s: bad URL: %w", redactURLs(cfg.URL), ue.Err)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", redactURLs(cfg.URL), err)
	}
	return nc, nil
}

// secret returns a password or token without one line end ("\n" or "\r\n") at its end. A
// Kubernetes Secret made from a file (kubectl create secret --from-file, a file written by
// echo) and given as NATS_PASSWORD or NATS_TOKEN keeps the file's line end, which nats.go
// sends as part of the secret: the server refused it, and a worker stopped at start-up. Only
// that goes; other white space may be the secret's own.
func secret(s string) string {
	if s, ok := strings.CutSuffix(s, "\n"); ok {
		return strings.TrimSuffix(s, "\r")
	}
	return s
}

// ConnectWait is Connect for a process that starts beside its NATS servers, as a worker does
// under compose or Kubernetes: while no server answers, it tries again (after 250 ms, doubling
// to 5 s) until ctx is done, warning at once and then at most every 30 s. Any other failure
// (credentials, TLS, a bad URL) is returned at once: waiting would not mend it. A server not
// reached is one that refused the connection, or whose name does not resolve yet (a pod's
// name before its pod is scheduled), or that a dial could not reach (unreachable).
func ConnectWait(ctx context.Context, cfg ConnectConfig, extra ...nats.Option) (*nats.Conn, error) {
	const (
		firstWait = 250 * time.Millisecond
		maxWait   = 5 * time.Second
		warnEvery = 30 * time.Second
	)
	wait := firstWait
	var warned time.Time
	for {
		nc, err := Connect(cfg, extra...)
		if err == nil || !unreachable(err) {
			return nc, err
		}
		if now := time.Now(); now.Sub(warned) >= warnEvery {
			logger(cfg).Warn("waiting for a NATS server", "url", redactURLs(cfg.URL), "err", err)
			warned = now
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (gave up waiting: %w)", err, context.Cause(ctx))
		case <-t.C:
		}
		wait = min(2*wait, maxWait)
	}
}

// unreachable says err is ConnectWait's "no server reached": nats.go says ErrNoServers only of
// refused connections, and returns other dial errors (a name that does not resolve, a dial
// that timed out or found no route) as they are.
func unreachable(err error) bool {
	var dial *net.OpError
	var dns *net.DNSError
	return errors.Is(err, nats.ErrNoServers) || errors.As(err, &dns) || (errors.As(err, &dial) && dial.Op == "dial")
}

// urlHasCredentials reports whether a URL of list (comma-separated, as nats.go takes them)
// holds a user or token.
func urlHasCredentials(list string) bool {
	for raw := range strings.SplitSeq(list, ",") {
		raw = strings.TrimSpace(raw)
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw // as nats.go reads "host:port"
		}
		if u, err := url.Parse(raw); err == nil && u.User != nil {
			return true
		}
	}
	return false
}

// checkURLs refuses a server URL of list whose port is no port (not a number from 1 to
// 65535): nats.go's dial fails on it as on a server that is down, and ConnectWait would wait
// for it for ever. It also refuses a URL with an '@' that is not the end of its user
// information: a password or token holding an unescaped '/', '?' or '#' (as generated
// secrets often do) ends the URL's host there, so that nats.go would take the secret's start
// for the host or port and dial it, and name it in its errors (a name that does not resolve),
// or fail to parse the URL with an error that quotes it.
func checkURLs(list string) error {
	for raw := range strings.SplitSeq(list, ",") {
		raw = strings.TrimSpace(raw)
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw // as nats.go reads "host:port"
		}
		u, err := url.Parse(raw)
		if scheme, rest, _ := strings.Cut(raw, "://"); strings.Contains(rest, "@") {
			// What follows the last '@' is the host, whatever the rest: its error quotes no secret.
			if _, herr := url.Parse(scheme + "://" + rest[strings.LastIndex(rest, "@")+1:]); herr != nil {
				var ue *url.Error
				if errors.As(herr, &ue) {
					herr = ue.Err
				}
				return fmt.Errorf("nats: server URL %s: bad URL: %w", redactURLs(raw), herr)
			}
			if err != nil || u.User == nil || strings.Contains(u.Path+u.RawQuery+u.Fragment, "@") {
				return fmt.Errorf("nats: server URL %s: its user information cannot be read: percent-encode a '/', '?', '#' or '%%' of a password or token in the URL (%%2F, %%3F, %%23, %%25), or give it with --nats-password or --nats-token", redactURLs(raw))
			}
		}
		if err != nil || u.Port() == "" {
			continue // nats.go says what is wrong with it, or takes its default port
		}
		if p, err := strconv.Atoi(u.Port()); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("nats: server URL %s: port %q is not a number from 1 to 65535", redactURLs(raw), u.Port())
		}
	}
	return nil
}

// redactURLs returns a comma-separated list of server URLs for a log line, with any user
// information (a password, or a token given as the user name) replaced: all that comes
// before a URL's last '@', even where the URL does not parse so (a password holding an
// unescaped '/', '?' or '#').
func redactURLs(list string) string {
	urls := strings.Split(list, ",")
	for i, raw := range urls {
		raw = strings.TrimSpace(raw)
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw // as nats.go reads "host:port"
		}
		scheme, rest, _ := strings.Cut(raw, "://")
		at := strings.LastIndex(rest, "@")
		u, err := url.Parse(scheme + "://" + rest[at+1:])
		switch {
		case err != nil:
			urls[i] = "(unparsable URL)"
		case at >= 0:
			u.User = url.User("redacted")
			urls[i] = u.String()
		default:
			urls[i] = u.String()
		}
	}
	return strings.Join(urls, ",")
}

// asyncErrorLogger logs the errors nats.go reports outside any call (a subscription too slow
// for its messages, a permission refused, a watch whose heartbeats stopped) through log, which
// nats.go would otherwise print to stderr in a format of its own. While the connection is
// down they are the drop's echoes, which the disconnect warning already told: they go to debug.
// A server's refusal of the credentials on reconnect is why the connection stays down: the
// first of a drop is a warning (refusalWarned, which the disconnect handler resets; nats.go
// calls both from one goroutine), and then warnWhileDown's warning says it every interval.
// Each warned of it every 30 s before, twice the same news (nats.go reports each try, several
// a second).
func asyncErrorLogger(log *slog.Logger, refusalWarned *bool) nats.ErrHandler {
	return func(nc *nats.Conn, sub *nats.Subscription, err error) {
		level := slog.LevelWarn
		if !nc.IsConnected() {
			level = slog.LevelDebug
			if authRefusal(err) && !*refusalWarned {
				level, *refusalWarned = slog.LevelWarn, true
				err = fmt.Errorf("%w: %s", err, refusedOnReconnect)
			}
		}
		attrs := []any{"err", err}
		if sub != nil && !strings.HasPrefix(sub.Subject, nats.InboxPrefix) { // an inbox tells a reader nothing
			attrs = append(attrs, "subject", sub.Subject)
		}
		log.Log(context.Background(), level, "nats error", attrs...)
	}
}

// refusedOnReconnect says what a refusal of the credentials on reconnect means.
const refusedOnReconnect = "the server refused this connection's credentials on reconnect; trying again until it accepts them"

// defaultStillDownEvery is how often a connection that stays down is warned of.
const defaultStillDownEvery = 30 * time.Second

// warnWhileDown warns every interval, until back is closed, that nc is still down since
// since, with why its last try to get back failed. nats.go reports a reconnect that fails in
// its TLS handshake (a server's certificate that --nats-tls-ca does not cover, a client
// certificate it refuses) to no handler: a worker logged the drop, then nothing about why it
// never came back.
func warnWhileDown(nc *nats.Conn, log *slog.Logger, interval time.Duration, since time.Time, back <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-back:
			return
		case <-t.C:
		}
		if nc.IsConnected() || nc.IsClosed() {
			return
		}
		attrs := []any{"for", time.Since(since).Round(time.Second)}
		if err := nc.LastError(); authRefusal(err) {
			attrs = append(attrs, "err", fmt.Errorf("%w: %s", err, refusedOnReconnect))
		} else if err != nil { // the last try's, unless it reached no server
			attrs = append(attrs, "err", err)
		}
		log.Warn("nats still disconnected", attrs...)
	}
}

// authRefusal says err is a server's refusal of the connection's credentials.
func authRefusal(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

func logger(cfg ConnectConfig) *slog.Logger {
	if cfg.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return cfg.Logger
}

// closeOnWriteTimeout is a nats.Option that wraps the connection's dialer, the caller's or
// nats.go's own, so that a write that times out closes its socket. nats.go drops the connection
// for its flusher's failed write only once it holds the connection's lock again, and the ping
// timer (or a Flush) waiting for that lock may take it first and, writing in place, wait out a
// second WriteTimeout on the same dead link (the frozen-proxy run of WriteTimeout's doc took
// 21 s with the flusher's drop alone: two of them). On a closed socket that write fails at
// once, and the read loop fails too and drops the connection itself.
func closeOnWriteTimeout(o *nats.Options) error {
	inner := o.CustomDialer
	if inner == nil { // as nats.go dials without one
		d := &net.Dialer{Timeout: o.Timeout}
		if o.Dialer != nil {
			copied := *o.Dialer
			d = &copied
		}
		if o.AllowMultipathTCP != nil {
			d.SetMultipathTCP(*o.AllowMultipathTCP)
		}
		inner = d
	}
	o.CustomDialer = writeTimeoutDialer{inner: inner}
	return nil
}

// writeTimeoutDialer dials with inner, and its connections close themselves when a write
// times out.
type writeTimeoutDialer struct {
	inner nats.CustomDialer
}

// Dial dials address on network with the inner dialer.
func (d writeTimeoutDialer) Dial(network, address string) (net.Conn, error) {
	c, err := d.inner.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &writeTimeoutConn{Conn: c}, nil
}

// SkipTLSHandshake passes on the inner dialer's answer: nats.go asks a custom dialer whether
// its connections are secure already.
func (d writeTimeoutDialer) SkipTLSHandshake() bool {
	s, ok := d.inner.(interface{ SkipTLSHandshake() bool })
	return ok && s.SkipTLSHandshake()
}

// writeTimeoutConn is a connection that closes itself when a write times out. That write's
// error is then the error of every read and write that fails, so that the connection is
// dropped for its cause, whoever notices first, and not for "use of closed network connection".
type writeTimeoutConn struct {
	net.Conn
	timedOut atomic.Pointer[error] // the write that timed out, once one has
}

// Write writes b, and closes the connection if the write's deadline passed.
func (c *writeTimeoutConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.timedOut.CompareAndSwap(nil, &err)
		_ = c.Conn.Close()
	}
	return n, c.cause(err)
}

// Read reads into b.
func (c *writeTimeoutConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	return n, c.cause(err)
}

// cause is the error of the write that timed out in place of err, if one did.
func (c *writeTimeoutConn) cause(err error) error {
	if err == nil {
		return nil
	}
	if timedOut := c.timedOut.Load(); timedOut != nil {
		return *timedOut
	}
	return err
}

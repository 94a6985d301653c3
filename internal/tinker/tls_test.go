package tinker_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// protoRecorder is an http.RoundTripper that records the protocol of every response its
// transport returns.
type protoRecorder struct {
	next http.RoundTripper

	mu     sync.Mutex
	protos map[string]int // resp.Proto → count
	alpn   map[string]int // negotiated ALPN protocol → count
}

func (p *protoRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := p.next.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("round trip %s: %w", req.URL.Path, err)
	}
	p.mu.Lock()
	p.protos[resp.Proto]++
	if resp.TLS != nil {
		p.alpn[resp.TLS.NegotiatedProtocol]++
	} else {
		p.alpn["no TLS"]++
	}
	p.mu.Unlock()
	return resp, nil
}

func (p *protoRecorder) seen() (protos, alpn map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	protos, alpn = map[string]int{}, map[string]int{}
	for k, v := range p.protos {
		protos[k] = v
	}
	for k, v := range p.alpn {
		alpn[k] = v
	}
	return protos, alpn
}

// TestSimTLSHTTP2SampleRoundTrip: the client against the simulator over HTTPS, the way it
// talks to the real service (§1.1 https base URL with a path prefix, §1.4 HTTP/2 negotiated
// by ALPN): Dial, NewSampler and Sample succeed, the sample has the requested shape, and
// every request of the client went over TLS as HTTP/2.
func TestSimTLSHTTP2SampleRoundTrip(t *testing.T) {
	const maxTokens, numSamples = 8, 2
	// MinGenTokens ≥ max_tokens and no stop condition: every sequence runs to max_tokens.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sim, base, roots := tlsSim(t, ctx, tinkersim.Config{APIKeys: []string{simKey}, LongPollWait: 100 * time.Millisecond,
		BaseLatency: 5 * time.Millisecond, MinGenTokens: maxTokens})

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	tr.ForceAttemptHTTP2 = true
	rec := &protoRecorder{next: tr, protos: map[string]int{}, alpn: map[string]int{}}
	c, err := tinker.Dial(ctx, tinker.Config{BaseURL: base + "/services/tinker-prod", APIKey: simKey,
		HTTPClient: &http.Client{Transport: rec}})
	if err != nil {
		t.Fatalf("dial the simulator over TLS: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(); tr.CloseIdleConnections() })

	s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatalf("new sampler: %v", err)
	}
	mt, seed := maxTokens, int64(7)
	res, err := s.Sample(ctx, tinker.SampleRequest{
		Prompt:     tinker.EncodedText([]int{151644, 872, 198, 3838, 374}),
		NumSamples: numSamples,
		Params:     tinker.SamplingParams{MaxTokens: &mt, Seed: &seed},
	})
	if err != nil {
		t.Fatalf("sample over TLS: %v", err)
	}
	if len(res.Response.Sequences) != numSamples {
		t.Fatalf("%d sequences, want %d", len(res.Response.Sequences), numSamples)
	}
	for i, q := range res.Response.Sequences {
		if len(q.Tokens) != maxTokens || len(q.Logprobs) != maxTokens || q.StopReason != tinker.StopReasonLength {
			t.Errorf("sequence %d: %d tokens, %d logprobs, stop reason %q; want %d, %d, %q",
				i, len(q.Tokens), len(q.Logprobs), q.StopReason, maxTokens, maxTokens, tinker.StopReasonLength)
		}
	}

	// The simulator served the whole path, and every reply the client read was HTTP/2 over TLS.
	st := sim.Stats()
	for _, ep := range []string{"client/config", "create_session", "create_sampling_session", "asample"} {
		if n := st.Requests[ep][http.StatusOK]; n != 1 {
			t.Errorf("simulator answered %s 200 %d times, want 1", ep, n)
		}
	}
	if st.SamplesCompleted != 1 {
		t.Errorf("simulator completed %d samples, want 1", st.SamplesCompleted)
	}
	protos, alpn := rec.seen()
	total := 0
	for _, n := range protos {
		total += n
	}
	if total < 5 || protos["HTTP/2.0"] != total || alpn["h2"] != total {
		t.Fatalf("responses by protocol %v, by ALPN %v: want all %d HTTP/2 (h2) and at least 5", protos, alpn, total)
	}
}

// TestRootCAs: the default client trusts Config.RootCAs (the simulator's certificate) and
// still negotiates HTTP/2; without them the same certificate is refused.
func TestRootCAs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sim, base, roots := tlsSim(t, ctx, tinkersim.Config{APIKeys: []string{simKey}})
	noRetry := tinker.Timing{HTTPMaxRetries: -1, SubmitRetryDeadline: time.Millisecond}
	if c, err := tinker.Dial(ctx, tinker.Config{BaseURL: base, APIKey: simKey, Sessionless: true, Timing: noRetry}); err == nil {
		_ = c.Close()
		t.Fatal("Dial trusted a self-signed certificate without RootCAs")
	} else if !errors.As(err, new(*tls.CertificateVerificationError)) {
		t.Fatalf("Dial without RootCAs: %v, want a certificate verification error", err)
	}
	c, err := tinker.Dial(ctx, tinker.Config{BaseURL: base, APIKey: simKey, RootCAs: roots})
	if err != nil {
		t.Fatalf("Dial with RootCAs: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatalf("new sampler: %v", err)
	}
	mt := 4
	if _, err := s.Sample(ctx, tinker.SampleRequest{Prompt: tinker.EncodedText([]int{1, 2, 3}), Params: tinker.SamplingParams{MaxTokens: &mt}}); err != nil {
		t.Fatalf("sample with RootCAs: %v", err)
	}
	st := sim.Stats()
	if got := st.Requests["asample"][http.StatusOK]; got != 1 {
		t.Fatalf("simulator answered asample 200 %d times, want 1", got)
	}
	var total int64
	for _, byStatus := range st.Requests {
		for _, n := range byStatus {
			total += n
		}
	}
	// The refused Dial never reached HTTP (its TLS handshake failed); all the rest is HTTP/2.
	if st.HTTP2Requests == 0 || st.HTTP2Requests != total {
		t.Fatalf("%d of %d requests came over HTTP/2, want all", st.HTTP2Requests, total)
	}
}

// tlsSim serves a simulator with cfg over HTTPS on loopback until ctx is done or the test
// ends, and returns it with its base URL and the pool that trusts its certificate.
func tlsSim(t *testing.T, ctx context.Context, cfg tinkersim.Config) (*tinkersim.Server, string, *x509.CertPool) {
	t.Helper()
	sim, err := tinkersim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	base, roots, err := sim.ListenTLS(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("ListenTLS: %v", err)
	}
	return sim, base, roots
}

// silentRelay forwards TCP connections to a target until silence; from then on the
// connections it carries forward nothing either way and stay open, as over a link that died
// without closing (a NAT or load balancer that forgot its flows). Connections made later are
// forwarded again.
type silentRelay struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	pairs []*relayPair
}

// relayPair is one relayed connection: the client's and the target's ends.
type relayPair struct {
	client, target net.Conn
	silent         atomic.Bool
}

// startSilentRelay relays a loopback port to target until the test ends.
func startSilentRelay(t *testing.T, target string) *silentRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &silentRelay{ln: ln, target: target}
	r.wg.Add(1)
	go r.accept() // ends when Cleanup closes the listener
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, p := range r.pairs {
			p.client.Close()
			p.target.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *silentRelay) addr() string { return r.ln.Addr().String() }

func (r *silentRelay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		p := &relayPair{client: c, target: u}
		r.mu.Lock()
		r.pairs = append(r.pairs, p)
		r.mu.Unlock()
		r.wg.Add(2)
		go r.copy(p, u, c)
		go r.copy(p, c, u)
	}
}

// copy forwards src to dst while p is not silent, and drops what comes after.
func (r *silentRelay) copy(p *relayPair, dst, src net.Conn) {
	defer r.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !p.silent.Load() {
				dst.Close()
			}
			return
		}
	}
}

// silence makes every connection open now go silent.
func (r *silentRelay) silence() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.pairs {
		p.silent.Store(true)
	}
	return len(r.pairs)
}

// TestADeadHTTP2ConnectionIsLeftForANewOne: the link under the default client's HTTP/2
// connection dies without closing. The sample sent next must not wait on that connection
// for ever: the client pings it, finds it dead, closes it and sends the sample again on a new
// connection. Without the pings every try waited out its 60 s timeout on the same
// connection, and the sample never went through.
func TestADeadHTTP2ConnectionIsLeftForANewOne(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, base, roots := tlsSim(t, ctx, tinkersim.Config{APIKeys: []string{simKey}, BaseLatency: time.Millisecond})
	relay := startSilentRelay(t, strings.TrimPrefix(base, "https://"))
	c, err := tinker.Dial(ctx, tinker.Config{BaseURL: "https://" + relay.addr(), APIKey: simKey, RootCAs: roots})
	if err != nil {
		t.Fatalf("Dial through the relay: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatalf("new sampler: %v", err)
	}
	if n := relay.silence(); n != 1 {
		t.Fatalf("%d connections through the relay before the cut; want the one HTTP/2 connection", n)
	}
	start := time.Now()
	mt := 4
	// Less than the 60 s a try waits for its answer: the sample must not wait one out.
	sctx, scancel := context.WithTimeout(ctx, 45*time.Second)
	defer scancel()
	if _, err := s.Sample(sctx, tinker.SampleRequest{Prompt: tinker.EncodedText([]int{1, 2, 3}), Params: tinker.SamplingParams{MaxTokens: &mt}}); err != nil {
		t.Fatalf("sample after the connection died: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("sampled %s after the connection died", time.Since(start).Round(time.Millisecond))
}

// TestARequestTimeoutOverHTTP2IsATimeout: HTTP/2 ends a request whose context is cancelled as
// a plain cancellation, whatever the cause; the client still reports its request's own
// timeout as one (a *ConnectionError with Timeout, wrapping context.DeadlineExceeded).
func TestARequestTimeoutOverHTTP2IsATimeout(t *testing.T) {
	var h2 atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 {
			h2.Add(1)
		}
		select { // no answer
		case <-release:
		case <-r.Context().Done():
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() { close(release); srv.Close() })
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())

	_, err := tinker.Dial(context.Background(), tinker.Config{BaseURL: srv.URL, APIKey: simKey, RootCAs: roots,
		// The request must reach the service over HTTP/2 before it times out: the TLS
		// handshake under -race on a loaded machine took more than 100 ms.
		Timing: tinker.Timing{RequestTimeout: time.Second, HTTPMaxRetries: -1, SubmitRetryDeadline: time.Nanosecond}})
	var ce *tinker.ConnectionError
	if !errors.As(err, &ce) || !ce.Timeout || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial against a service that never answers: %v; want a timed-out *ConnectionError", err)
	}
	if h2.Load() == 0 {
		t.Fatal("the request did not go over HTTP/2")
	}
}

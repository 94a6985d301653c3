package queue

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// startServer runs a nats-server with opts (on loopback, a random port unless opts names one,
// no JetStream) for the test.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.NoLog, opts.NoSigs = "127.0.0.1", true, true
	if opts.Port == 0 {
		opts.Port = -1
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s
}

func TestConnectWithUserPasswordAndToken(t *testing.T) {
	t.Parallel()
	s := startServer(t, &server.Options{Username: "fleet", Password: "s3cret"})
	if _, err := Connect(ConnectConfig{URL: s.ClientURL()}); err == nil {
		t.Fatal("connected without credentials")
	}
	nc, err := Connect(ConnectConfig{URL: s.ClientURL(), User: "fleet", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, err := Connect(ConnectConfig{URL: s.ClientURL(), User: "fleet", Password: "x", Token: "y"}); err == nil {
		t.Fatal("two kinds of credentials at once were accepted")
	}
	// Credentials in the URL are one kind too: nats.go took them over a password beside them,
	// without a word.
	inURL := strings.Replace(s.ClientURL(), "nats://", "nats://fleet:s3cret@", 1)
	if _, err := Connect(ConnectConfig{URL: "nats://127.0.0.1:1, " + inURL, Password: "wrong"}); err == nil || !strings.Contains(err.Error(), "a user or token in the server URL counts as one") {
		t.Fatalf("credentials in the URL beside a password: %v, want a refusal", err)
	}
	nc, err = Connect(ConnectConfig{URL: inURL})
	if err != nil {
		t.Fatalf("credentials in the URL alone: %v", err)
	}
	nc.Close()
	tok := startServer(t, &server.Options{Authorization: "tok-123"})
	nc, err = Connect(ConnectConfig{URL: tok.ClientURL(), Token: "tok-123"})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

func TestConnectWithNKey(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	nc, err := Connect(ConnectConfig{URL: s.ClientURL(), NKeyFile: seedFile})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, err := Connect(ConnectConfig{URL: s.ClientURL()}); err == nil {
		t.Fatal("connected without the nkey")
	}
}

func TestConnectWithMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caKey, caCert := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", caCert.Raw)
	serverCert := issue(t, caKey, caCert, "server", []net.IP{net.ParseIP("127.0.0.1")}, x509.ExtKeyUsageServerAuth)
	clientCert := issue(t, caKey, caCert, "worker", nil, x509.ExtKeyUsageClientAuth)
	writePEM(t, filepath.Join(dir, "client.pem"), "CERTIFICATE", clientCert.Certificate[0])
	clientKey, err := x509.MarshalECPrivateKey(clientCert.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "client-key.pem"), "EC PRIVATE KEY", clientKey)

	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	s := startServer(t, &server.Options{
		TLS:       true,
		TLSVerify: true,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
	})
	url := "tls://" + s.Addr().String()
	nc, err := Connect(ConnectConfig{URL: url, TLSCA: filepath.Join(dir, "ca.pem"),
		TLSCert: filepath.Join(dir, "client.pem"), TLSKey: filepath.Join(dir, "client-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	if !nc.TLSRequired() {
		t.Fatal("the connection is not TLS")
	}
	nc.Close()
	if _, err := Connect(ConnectConfig{URL: url, TLSCA: filepath.Join(dir, "ca.pem")}); err == nil {
		t.Fatal("connected without a client certificate")
	}
	if _, err := Connect(ConnectConfig{URL: url, TLSCert: filepath.Join(dir, "client.pem")}); err == nil {
		t.Fatal("a certificate without its key was accepted")
	}
}

func newCA(t *testing.T) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func issue(t *testing.T, caKey *ecdsa.PrivateKey, ca *x509.Certificate, name string, ips []net.IP, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: ips,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestConnectWaitWaitsForTheServer(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	port := addr.Port

	var logs testLog
	started := make(chan *server.Server, 1)
	go func() {
		time.Sleep(600 * time.Millisecond)
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true, Username: "fleet", Password: "s3cret"})
		if err != nil {
			t.Error(err)
			started <- nil
			return
		}
		go s.Start()
		started <- s
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	begin := time.Now()
	nc, err := ConnectWait(ctx, ConnectConfig{URL: fmt.Sprintf("nats://fleet:s3cret@127.0.0.1:%d", port), Logger: logs.logger()})
	if s := <-started; s != nil {
		t.Cleanup(s.Shutdown)
	}
	if err != nil {
		t.Fatalf("ConnectWait: %v", err)
	}
	defer nc.Close()
	if waited := time.Since(begin); waited < 500*time.Millisecond {
		t.Errorf("connected after %v, before the server started", waited)
	}
	out := logs.String()
	if !strings.Contains(out, "waiting for a NATS server") {
		t.Errorf("no warning while waiting; log:\n%s", out)
	}
	if strings.Contains(out, "s3cret") || !strings.Contains(out, "redacted@127.0.0.1") {
		t.Errorf("the warning must name the server without its password; log:\n%s", out)
	}
}

func TestConnectWaitGivesUpWithItsContext(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
	defer cancel()
	_, err := ConnectWait(ctx, ConnectConfig{URL: "nats://fleet:s3cret@" + addr.String()})
	if !errors.Is(err, nats.ErrNoServers) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want no servers and the context's deadline", err)
	}
	if msg := err.Error(); strings.Contains(msg, "s3cret") || !strings.Contains(msg, addr.String()) {
		t.Errorf("err = %q, want the server's address without its password", msg)
	}
}

func TestConnectWaitReturnsOtherErrorsAtOnce(t *testing.T) {
	t.Parallel()
	s := startServer(t, &server.Options{Username: "fleet", Password: "s3cret"})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	begin := time.Now()
	_, err := ConnectWait(ctx, ConnectConfig{URL: s.ClientURL(), User: "fleet", Password: "wrong"})
	if err == nil || errors.Is(err, nats.ErrNoServers) {
		t.Fatalf("err = %v, want the server's refusal", err)
	}
	if took := time.Since(begin); took > 10*time.Second {
		t.Errorf("a refused login took %v: it was retried", took)
	}
}

// TestConnectWaitRefusesAPortThatIsNone: a URL whose port is out of range fails at once, named
// without its password; nats.go's dial failed on it as on a server down, and a worker waited
// for it for ever.
func TestConnectWaitRefusesAPortThatIsNone(t *testing.T) {
	t.Parallel()
	for _, list := range []string{"nats://fleet:s3cret@127.0.0.1:99999", "127.0.0.1:4222, 127.0.0.1:0"} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := ConnectWait(ctx, ConnectConfig{URL: list})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "port") || strings.Contains(err.Error(), "gave up waiting") ||
			strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: err = %v, want the port refused at once, without the password", list, err)
		}
	}
}

// TestConnectWaitWaitsForANameThatDoesNotResolveYet: a server named by a name that does not
// resolve (a Kubernetes pod's, before its pod runs) is waited for like one that refuses the
// connection; nats.go reports only the refusal as ErrNoServers.
func TestConnectWaitWaitsForANameThatDoesNotResolveYet(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err := ConnectWait(ctx, ConnectConfig{URL: "nats://nats-0.nats-headless.tinkerfleet-test.invalid:4222"})
	if took := time.Since(begin); took < time.Second || err == nil || !strings.Contains(err.Error(), "gave up waiting") {
		t.Fatalf("ConnectWait returned after %v: %v; want it to wait until its context ended", took, err)
	}
}

// TestABadURLsErrorHoldsNoPassword: nats.go's error for a URL it cannot parse quotes the
// URL, with the password in it; Connect says only what is wrong.
func TestABadURLsErrorHoldsNoPassword(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"nats://fleet:s3cret@127.0.0.1:42x22", "nats://n1:4222,nats://fleet:s3cret@n2:42x22"} {
		_, err := Connect(ConnectConfig{URL: u})
		if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "bad URL") {
			t.Errorf("Connect(%q): %v; want a bad URL named without its password", u, err)
		}
	}
}

// TestConnectWarnsOfAReconnect: a reader shown only warnings (submit) learns that a
// disconnect ended, and after how long.
func TestConnectWarnsOfAReconnect(t *testing.T) {
	t.Parallel()
	port := freeAddr(t).Port
	s := startServer(t, &server.Options{Port: port})
	var logs testLog
	nc, err := Connect(ConnectConfig{URL: s.ClientURL(), Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s.Shutdown()
	waitFor(t, "the disconnect", func() bool { return strings.Contains(logs.String(), `msg="nats disconnected"`) })
	startServer(t, &server.Options{Port: port})
	waitFor(t, "the reconnect", func() bool { return strings.Contains(logs.String(), `msg="nats reconnected"`) })
	if !regexp.MustCompile(`level=WARN msg="nats reconnected" url=nats://127.0.0.1:\d+ after=\d+(\.\d+)?m?s\n`).MatchString(logs.String()) {
		t.Errorf("want a warning of the reconnect with the outage's length; log:\n%s", logs.String())
	}
}

// TestConnectLogsNATSErrorsThatComeLater: an error nats.go reports outside any call (here a
// publish the server refuses) reaches the log as a warning, not nats.go's own line on stderr
// (which broke --log-json output).
func TestConnectLogsNATSErrorsThatComeLater(t *testing.T) {
	t.Parallel()
	s := startServer(t, &server.Options{Users: []*server.User{{
		Username: "fleet", Password: "s3cret",
		Permissions: &server.Permissions{Publish: &server.SubjectPermission{Deny: []string{"forbidden.>"}}},
	}}})
	var logs testLog
	nc, err := Connect(ConnectConfig{URL: s.ClientURL(), User: "fleet", Password: "s3cret", Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("forbidden.x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refusal in the log", func() bool { return strings.Contains(logs.String(), `msg="nats error"`) })
	if want := `level=WARN msg="nats error" err="nats: permissions violation: Permissions Violation for Publish to \"forbidden.x\""`; !strings.Contains(logs.String(), want) {
		t.Errorf("want %s in the log:\n%s", want, logs.String())
	}

	// While the connection is down, its subscriptions' complaints echo the drop, of which
	// the disconnect warning told: they are for debugging.
	var down testLog
	report := asyncErrorLogger(slog.New(slog.NewTextHandler(&down, &slog.HandlerOptions{Level: slog.LevelInfo})), new(bool))
	nc.Close()
	report(nc, nil, nats.ErrConsumerNotActive)
	if down.String() != "" {
		t.Errorf("an error reported while disconnected was logged above debug: %s", down.String())
	}
}

func TestRedactURLs(t *testing.T) {
	for in, want := range map[string]string{
		"nats://n1:4222": "nats://n1:4222",
		"nats://fleet:s3cret@n1:4222, tls://tok@n2": "nats://redacted@n1:4222,tls://redacted@n2",
		"127.0.0.1:4222":                  "nats://127.0.0.1:4222",
		"nats://fleet:s3cret@n1:4222/%zz": "(unparsable URL)",
	} {
		if got := redactURLs(in); got != want {
			t.Errorf("redactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}

// freeAddr returns a loopback address nobody listens on (it was free a moment ago).
func freeAddr(t *testing.T) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr)
}

// testLog collects a test's log lines from any goroutine (fleettest.Buffer, but fleettest
// imports this package).
type testLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *testLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *testLog) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// TestAPasswordWithASlashHashOrQuestionMarkIsNotShown: a generated password often holds '/',
// '#' or '?', which a URL reads as the start of its path, fragment or query unless they are
// escaped. The URL then parses with no user information (or fails on a "port" that is the
// password's start), and neither its error nor its redacted form may show the password.
func TestAPasswordWithASlashHashOrQuestionMarkIsNotShown(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"nats://fleet:s3cret/x@127.0.0.1:4222",
		"nats://fleet:s3cret#x@127.0.0.1:4222",
		"nats://fleet:s3cret?x@127.0.0.1:4222",
		"nats://fleet:/s3cret@127.0.0.1:4222",
		"nats://fleet:#s3cret@127.0.0.1:4222",
		"nats://fleet:?s3cret@127.0.0.1:4222",
		"nats://fleet:4222/s3cret@127.0.0.1:4222",
		"nats://n1:4222, nats://fleet:4222#s3cret@127.0.0.1:4222",
		"nats://s3cret/x@127.0.0.1:4222", // a token
		"nats://fleet:s3cret/x@127.0.0.1:42x22",
	} {
		if got := redactURLs(u); strings.Contains(got, "s3cret") {
			t.Errorf("redactURLs(%q) = %q, shows the password", u, got)
		}
		if err := checkURLs(u); err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("checkURLs(%q): %v, shows the password", u, err)
		}
	}
	// Each fails at once, without a dial to a host that is the secret's start (a name that
	// does not resolve, which ConnectWait would wait for, naming it every 30 s).
	for _, u := range []string{"nats://fleet:s3cret/x@127.0.0.1:4222", "nats://fleet:s3cret#x@127.0.0.1:4222",
		"nats://fleet:/s3cret@127.0.0.1:4222", "nats://s3cret/x@127.0.0.1:4222", "nats://fleet:s3cret/x@127.0.0.1:42x22"} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := ConnectWait(ctx, ConnectConfig{URL: u})
		cancel()
		if err == nil || strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "gave up waiting") {
			t.Errorf("ConnectWait(%q): %v; want an error at once, without the password", u, err)
		}
	}
}

// TestAConnectionRefusedOnReconnectKeepsTrying: a server that comes back from a restart
// refusing the credentials for a while (its password rotated before the clients', accounts
// that load late) left the connection closed for good: nats.go gives up after two refusals in
// a row, and a worker then sampled nothing until it was restarted, alive and quiet (the
// refusals were logged at debug). Now the connection keeps trying, as after any drop, says why
// it cannot get back, without the password, and is back once the server accepts it again.
func TestAConnectionRefusedOnReconnectKeepsTrying(t *testing.T) {
	t.Parallel()
	port := freeAddr(t).Port
	s := startServer(t, &server.Options{Port: port, Username: "fleet", Password: "s3cret"})
	var logs testLog
	nc, err := Connect(ConnectConfig{URL: s.ClientURL(), User: "fleet", Password: "s3cret",
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s.Shutdown()
	rotated := startServer(t, &server.Options{Port: port, Username: "fleet", Password: "rotated"})
	waitFor(t, "a warning of the refusal", func() bool { return strings.Contains(logs.String(), "authorization violation") })
	// nats.go gave up after its second refusal in a row from the same server.
	time.Sleep(2 * time.Second)
	if nc.IsClosed() {
		t.Fatalf("the connection closed after the server refused it; log:\n%s", logs.String())
	}
	rotated.Shutdown()
	startServer(t, &server.Options{Port: port, Username: "fleet", Password: "s3cret"})
	waitFor(t, "the reconnect", nc.IsConnected)
	out := logs.String()
	if strings.Contains(out, "s3cret") || strings.Contains(out, "rotated") {
		t.Errorf("the log shows a password:\n%s", out)
	}
	if n := strings.Count(out, "authorization violation"); n > 2 {
		t.Errorf("the refusal was logged %d times in 2 s, want it at most every 30 s; log:\n%s", n, out)
	}
}

// TestAConnectionThatCannotGetBackSaysWhy: a server that comes back from a restart with a
// certificate the client does not trust (renewed by another CA than --nats-tls-ca's) refuses
// every reconnect in its TLS handshake, which nats.go reports to no handler: a worker logged
// "nats disconnected" once and then nothing about why it stayed down. Now, while the
// connection stays down, a warning says for how long and why its last try failed.
func TestAConnectionThatCannotGetBackSaysWhy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serve := func(port int) *server.Server {
		caKey, caCert := newCA(t)
		writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", caCert.Raw)
		cert := issue(t, caKey, caCert, "server", []net.IP{net.ParseIP("127.0.0.1")}, x509.ExtKeyUsageServerAuth)
		return startServer(t, &server.Options{Port: port, TLS: true,
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	}
	port := freeAddr(t).Port
	s := serve(port)
	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fleet-ca.pem"), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testLog
	nc, err := Connect(ConnectConfig{URL: "tls://" + s.Addr().String(), TLSCA: filepath.Join(dir, "fleet-ca.pem"),
		stillDownEvery: 300 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s.Shutdown()
	serve(port) // another CA
	waitFor(t, "a warning of why the connection stays down", func() bool {
		return strings.Contains(logs.String(), "certificate signed by unknown authority")
	})
	if !regexp.MustCompile(`level=WARN msg="nats still disconnected" for=\d`).MatchString(logs.String()) {
		t.Errorf("want a warning that the connection is still down, and for how long; log:\n%s", logs.String())
	}
}

// TestATrailingLineEndOfAPasswordOrTokenIsNoPartOfIt: a Kubernetes Secret made from a file
// (kubectl create secret --from-file, a password written by echo) and mounted as NATS_PASSWORD
// or NATS_TOKEN keeps the file's line end, which nats.go sends as part of the secret: the
// server refused it ("authorization violation"), and the worker stopped at start-up. The
// line end, "\n" or "\r\n", is now no part of it; the refusal of a wrong one names no secret.
func TestATrailingLineEndOfAPasswordOrTokenIsNoPartOfIt(t *testing.T) {
	t.Parallel()
	s := startServer(t, &server.Options{Username: "fleet", Password: "s3cret"})
	for _, pw := range []string{"s3cret\n", "s3cret\r\n"} {
		nc, err := Connect(ConnectConfig{URL: s.ClientURL(), User: "fleet", Password: pw})
		if err != nil {
			t.Fatalf("password %q: %v", pw, err)
		}
		nc.Close()
	}
	// Only one line end goes: other white space may be the secret's own.
	for _, pw := range []string{"s3cret ", "s3cret\n\n", "s3cret\r", " s3cret"} {
		_, err := Connect(ConnectConfig{URL: s.ClientURL(), User: "fleet", Password: pw})
		if err == nil {
			t.Fatalf("password %q was accepted", pw)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("the refusal shows the password: %v", err)
		}
	}
	tok := startServer(t, &server.Options{Authorization: "tok-123"})
	for _, token := range []string{"tok-123\n", "tok-123\r\n"} {
		nc, err := Connect(ConnectConfig{URL: tok.ClientURL(), Token: token})
		if err != nil {
			t.Fatalf("token %q: %v", token, err)
		}
		nc.Close()
	}
}

// TestARefusalOnReconnectIsWarnedOfOncePerInterval: while a server refused the connection's
// credentials on reconnect, two warnings said so every 30 s: the refusal's ("nats error …
// authorization violation") and the connection's still being down, whose last error is that
// refusal. The refusal is now warned of once, at its first try, and then by the warning that
// the connection is still down, which says what the refusal means.
func TestARefusalOnReconnectIsWarnedOfOncePerInterval(t *testing.T) {
	t.Parallel()
	const every = 300 * time.Millisecond
	port := freeAddr(t).Port
	s := startServer(t, &server.Options{Port: port, Username: "fleet", Password: "s3cret"})
	var logs testLog
	nc, err := Connect(ConnectConfig{URL: s.ClientURL(), User: "fleet", Password: "s3cret", stillDownEvery: every,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s.Shutdown()
	startServer(t, &server.Options{Port: port, Username: "fleet", Password: "rotated"})
	waitFor(t, "a warning of the refusal", func() bool { return strings.Contains(logs.String(), "authorization violation") })
	time.Sleep(10 * every)
	out := logs.String()
	// One at the first refusal, then one every interval: 11 in 10 intervals and a bit, give
	// or take one for timing; about twice as many before.
	if n := strings.Count(strings.ToLower(out), "authorization violation"); n > 13 {
		t.Errorf("the refusal was warned of %d times in about 10 intervals of %v, want one an interval; log:\n%s", n, every, out)
	}
	if !strings.Contains(out, `msg="nats still disconnected"`) || !strings.Contains(out, "refused this connection's credentials") {
		t.Errorf("want the still-down warning to say that the server refuses the credentials; log:\n%s", out)
	}
	if strings.Contains(out, "s3cret") || strings.Contains(out, "rotated") {
		t.Errorf("the log shows a password:\n%s", out)
	}
}

// TestAnEmbeddedServerSlowToGreetIsWaitedFor: `submit --local` connects to its own embedded
// server, on this machine, and a machine under heavy load (load average about 20) once took
// longer than nats.go's 2 s connect timeout to get the server's greeting through: the run
// failed with "i/o timeout". A server this process embeds, or another process's on this
// machine (ConnectConfig.Plain), is given embeddedConnectTimeout. The greeting comes here
// 2.5 s late, through a proxy.
func TestAnEmbeddedServerSlowToGreetIsWaitedFor(t *testing.T) {
	t.Parallel()
	s := startServer(t, &server.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var proxies sync.WaitGroup
	t.Cleanup(func() { ln.Close(); proxies.Wait() })
	proxies.Add(1)
	go func() { // accepts one connection, then passes it on to the server 2.5 s late
		defer proxies.Done()
		in, err := ln.Accept()
		if err != nil {
			return
		}
		defer in.Close()
		out, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			return
		}
		defer out.Close()
		time.Sleep(2500 * time.Millisecond)
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(out, in); out.Close(); done <- struct{}{} }()
		go func() { _, _ = io.Copy(in, out); in.Close(); done <- struct{}{} }()
		<-done
		<-done
	}()
	cfg := ConnectConfig{URL: "nats://" + ln.Addr().String()}.Plain()
	nc, err := Connect(cfg, nats.NoReconnect())
	if err != nil {
		t.Fatalf("connect to a local server whose greeting came 2.5 s late: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Error(err)
	}
	nc.Close()
}

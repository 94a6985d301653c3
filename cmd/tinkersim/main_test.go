package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestHelpDocumentsEveryFlag(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(t.Context(), []string{"-h"}, env(nil), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h: %v", err)
	}
	for _, name := range []string{"addr", "api-key", "admin-token", "capacity", "base-latency", "per-token-latency",
		"long-poll-wait", "retry-after", "result-ttl", "read-ttl", "model", "seed", "min-gen-tokens", "token-min", "token-max",
		"stop-token-prob", "default-max-tokens", "max-num-samples", "metadata-threshold", "no-dynamic-config",
		"training-runs", "client-config", "fault", "shutdown-timeout", "log-level", "tls-cert", "tls-key", "jwt-auth", "jwt-lifetime",
		"session-timeout", "TINKERSIM_API_KEYS"} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("-h does not mention %s", name)
		}
	}
}

// TestClientConfigFlag: -client-config sets client/config flags, so that a 402 fault can
// outlast a billing window (§2.3) that the client reads from there.
func TestClientConfigFlag(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{"-client-config", `{"billing_exception_max_pause_duration_sec": 2.5, "sample_no_retries": true}`,
		"-fault", "kind=402"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := o.cfg.ClientConfig["billing_exception_max_pause_duration_sec"].(json.Number); !ok || v.String() != "2.5" ||
		o.cfg.ClientConfig["sample_no_retries"] != true || len(o.cfg.Faults) != 1 {
		t.Fatalf("client config %v, faults %v", o.cfg.ClientConfig, o.cfg.Faults)
	}
	for _, bad := range []string{"[1]", "null", "{", `{"a":1} {}`, "3"} {
		if _, err := parseFlags([]string{"-client-config", bad}, env(nil), io.Discard); err == nil {
			t.Errorf("-client-config %s accepted", bad)
		}
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{"-api-key", "tml-a,tml-b", "-model", "x/y=4096", "-capacity", "3",
		"-fault", "kind=429,start=1s,duration=2s", "-fault", "kind=failed,category=user,rate=0.5"},
		env(map[string]string{"TINKERSIM_API_KEYS": "tml-c", "TINKERSIM_ADMIN_TOKEN": "adm"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.cfg
	if strings.Join(c.APIKeys, " ") != "tml-a tml-b tml-c" || c.AdminToken != "adm" || c.Capacity != 3 ||
		len(c.Models) != 1 || c.Models[0] != (tinkersim.Model{Name: "x/y", MaxContextLength: 4096}) || len(c.Faults) != 2 ||
		c.Faults[0].Duration != 2*time.Second || c.Faults[1].Category != "user" {
		t.Fatalf("config %+v", c)
	}
	if c.JWTAuth || c.JWTLifetime != time.Hour {
		t.Fatalf("JWT auth by default: %v, lifetime %v", c.JWTAuth, c.JWTLifetime)
	}
	o, err = parseFlags([]string{"-jwt-auth", "-jwt-lifetime", "90s"}, env(nil), io.Discard)
	if err != nil || !o.cfg.JWTAuth || o.cfg.JWTLifetime != 90*time.Second {
		t.Fatalf("-jwt-auth -jwt-lifetime 90s: %+v, %v", o, err)
	}
	o, err = parseFlags([]string{"-tls-cert", "c.pem", "-tls-key", "k.pem"}, env(nil), io.Discard)
	if err != nil || o.tlsCert != "c.pem" || o.tlsKey != "k.pem" {
		t.Fatalf("-tls-cert/-tls-key: %+v, %v", o, err)
	}
	for _, bad := range [][]string{{"-model", "nocontext"}, {"-fault", "kind=nope"}, {"stray"},
		{"-tls-cert", "c.pem"}, {"-tls-key", "k.pem"}} {
		if _, err := parseFlags(bad, env(nil), io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRunServesAndShutsDown(t *testing.T) {
	t.Parallel()
	const key = "tml-secret-do-not-log"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &fleettest.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-long-poll-wait", "50ms", "-base-latency", "1ms"},
			env(map[string]string{"TINKERSIM_API_KEYS": key}), logs)
	}()
	re := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)`)
	var base string
	deadline := time.Now().Add(10 * time.Second)
	for base == "" {
		if m := re.FindStringSubmatch(logs.String()); m != nil {
			base = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no listening line in logs: %s", logs.String())
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	for _, k := range []string{key, "tml-other"} {
		req, _ := http.NewRequest("POST", base+"/services/tinker-prod/api/v1/client/config", strings.NewReader(`{"sdk_version":"0.25.0"}`))
		req.Header.Set("X-API-Key", k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := 200
		if k != key {
			want = 401
		}
		if resp.StatusCode != want {
			t.Fatalf("key %d: status %d, want %d", len(k), resp.StatusCode, want)
		}
	}
	cancel() // as SIGINT would
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
	if strings.Contains(logs.String(), key) {
		t.Fatal("the API key appears in the logs")
	}
	if !strings.Contains(logs.String(), "tinkersim stopped") {
		t.Fatalf("logs: %s", logs.String())
	}
}

// writeKeyPair writes a fresh self-signed ECDSA P-256 certificate for 127.0.0.1 and its key
// as PEM files into dir and returns their paths and a pool trusting the certificate.
func writeKeyPair(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "tinkersim cmd test"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), 0o600); err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(leaf)
	return certFile, keyFile, roots
}

// TestRunServesTLS: with -tls-cert and -tls-key the simulator serves HTTPS with that key pair
// and HTTP/2 is negotiated (§1.4); a missing key file is a start-up error.
func TestRunServesTLS(t *testing.T) {
	t.Parallel()
	const key = "tml-sim.cmd-tls-key"
	certFile, keyFile, roots := writeKeyPair(t, t.TempDir())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &fleettest.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-tls-cert", certFile, "-tls-key", keyFile},
			env(map[string]string{"TINKERSIM_API_KEYS": key}), logs)
	}()
	re := regexp.MustCompile(`url=(https://127\.0\.0\.1:\d+)`)
	var base string
	deadline := time.Now().Add(10 * time.Second)
	for base == "" {
		if m := re.FindStringSubmatch(logs.String()); m != nil {
			base = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no https listening line in logs: %s", logs.String())
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", base+"/api/v1/healthz", nil)
	req.Header.Set("X-API-Key", key)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("healthz over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("healthz: %d over %s, want 200 over HTTP/2", resp.StatusCode, resp.Proto)
	}
	tr.CloseIdleConnections() // else graceful shutdown waits for the idle HTTP/2 connection
	cancel()                  // as SIGINT would
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancellation")
	}

	err = run(t.Context(), []string{"-addr", "127.0.0.1:0", "-tls-cert", certFile, "-tls-key", certFile + ".missing"},
		env(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-tls-key") {
		t.Fatalf("run with a missing key file: %v", err)
	}
}

// TestRunJWTAuth: with -jwt-auth the program serves the JWT exchange (§2.2, §3.2): the API key
// buys a JWT at auth/token, the API then takes the JWT and refuses the key; neither the key
// nor the JWT is logged.
func TestRunJWTAuth(t *testing.T) {
	t.Parallel()
	const key = "tml-sim.cmd-jwt-key"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &fleettest.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-jwt-auth", "-jwt-lifetime", "10m", "-log-level", "debug"},
			env(map[string]string{"TINKERSIM_API_KEYS": key}), logs)
	}()
	re := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+).* jwt_auth=true jwt_lifetime=10m0s`)
	var base string
	deadline := time.Now().Add(10 * time.Second)
	for base == "" {
		if m := re.FindStringSubmatch(logs.String()); m != nil {
			base = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no listening line with jwt_auth in logs: %s", logs.String())
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	post := func(path, cred, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "POST", base+"/api/v1/"+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", cred)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	if st, b := post("client/config", key, `{"sdk_version":"0.25.0"}`); st != 200 || !strings.Contains(string(b), `"pjwt_auth_enabled":true`) {
		t.Fatalf("client/config: %d %s", st, b)
	}
	st, b := post("auth/token", key, `{}`)
	var tok struct {
		JWT string `json:"jwt"`
	}
	if st != 200 || json.Unmarshal(b, &tok) != nil || !strings.HasPrefix(tok.JWT, "eyJ") {
		t.Fatalf("auth/token: %d %s", st, b)
	}
	session := `{"tags":[],"user_metadata":{},"sdk_version":"0.25.0","type":"create_session"}`
	if st, b := post("create_session", key, session); st != 401 {
		t.Fatalf("create_session with the API key: %d %s, want 401", st, b)
	}
	if st, b := post("create_session", tok.JWT, session); st != 200 {
		t.Fatalf("create_session with the JWT: %d %s", st, b)
	}
	cancel() // as SIGINT would
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
	if l := logs.String(); strings.Contains(l, key) || strings.Contains(l, tok.JWT) {
		t.Fatalf("a credential appears in the logs: %s", l)
	}
}

// TestZeroFlagsMeanZeroOrAreRefused: the simulator's Config reads 0 as its default, so a 0
// given on the command line quietly meant 64 samples at once, 25 s polls, 5 % stop tokens or
// three training runs. Where 0 has a meaning it now has it; elsewhere it is refused.
func TestZeroFlagsMeanZeroOrAreRefused(t *testing.T) {
	o, err := parseFlags([]string{"-stop-token-prob", "0", "-training-runs", "0"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := tinkersim.New(o.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if c := sim.Config(); c.StopTokenProbability >= 0 || c.TrainingRuns >= 0 {
		t.Errorf("-stop-token-prob 0 -training-runs 0 run with stop probability %v and %d training runs", c.StopTokenProbability, c.TrainingRuns)
	}
	for _, args := range [][]string{{"-capacity", "0"}, {"-long-poll-wait", "0s"}, {"-read-ttl", "0"}, {"-default-max-tokens", "0"},
		{"-default-max-tokens", "-5"}, {"-max-num-samples", "-1"}, {"-min-gen-tokens", "-3"}, {"-token-min", "0", "-token-max", "0"}, {"-token-max", "500"}} {
		if _, err := parseFlags(args, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), args[0]+" ") {
			t.Errorf("%v: %v, want it refused", args, err)
		}
	}
	if o, err := parseFlags([]string{"-capacity", "3", "-metadata-threshold", "0"}, env(nil), io.Discard); err != nil || o.cfg.Capacity != 3 {
		t.Errorf("-capacity 3 -metadata-threshold 0: %v", err)
	}
}

// TestFlagsAfterAnUnexpectedArgumentAreNotPrinted: a boolean flag given its value apart
// (-jwt-auth true) leaves "true" as an argument; the flags after it, an admin token or API
// keys among them, are read, not printed back in the error.
func TestFlagsAfterAnUnexpectedArgumentAreNotPrinted(t *testing.T) {
	t.Parallel()
	_, err := parseFlags([]string{"-jwt-auth", "true", "-admin-token", "adm-s3cr3t", "-api-key", "tml-s3cr3t"}, env(nil), io.Discard)
	if err == nil {
		t.Fatal("the argument true was accepted")
	}
	for _, secret := range []string{"adm-s3cr3t", "tml-s3cr3t"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error %q prints %q", err, secret)
		}
	}
}

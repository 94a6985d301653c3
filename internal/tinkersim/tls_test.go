package tinkersim

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// tlsGet sends GET url with the test key through tr and returns the response and its body.
func tlsGet(t *testing.T, tr *http.Transport, url string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Header.Set("X-API-Key", testKey)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(body), nil
}

// tlsTransport is a client transport trusting roots; h2 selects ForceAttemptHTTP2 (without it
// a transport with a custom TLSClientConfig speaks HTTP/1.1 only).
func tlsTransport(t *testing.T, roots *x509.CertPool, h2 bool) *http.Transport {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: h2}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// TestListenTLSServesHTTP2: ListenTLS serves the API over HTTPS with HTTP/2 negotiated by ALPN
// (§1.4), HTTP/1.1 still offered, a fresh self-signed ECDSA P-256 certificate for the loopback
// names that only the returned pool trusts, and stops with Close.
func TestListenTLSServesHTTP2(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{APIKeys: []string{testKey}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	base, roots, err := srv.ListenTLS(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatalf("ListenTLS: %v", err)
	}
	if !strings.HasPrefix(base, "https://127.0.0.1:") {
		t.Fatalf("base URL %q", base)
	}

	resp, body, err := tlsGet(t, tlsTransport(t, roots, true), base+"/services/tinker-prod/api/v1/healthz")
	if err != nil {
		t.Fatalf("healthz over TLS: %v", err)
	}
	if resp.StatusCode != http.StatusOK || body != `{"status":"ok"}` {
		t.Fatalf("healthz: %d %q", resp.StatusCode, body)
	}
	if resp.ProtoMajor != 2 || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2" {
		t.Fatalf("protocol %s (ALPN %q), want HTTP/2", resp.Proto, resp.TLS.NegotiatedProtocol)
	}
	if n := srv.Stats().Requests[epHealthz][http.StatusOK]; n != 1 {
		t.Fatalf("the simulator counted %d healthz replies, want 1", n)
	}

	leaf := resp.TLS.PeerCertificates[0]
	if k, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("certificate key %T, want ECDSA P-256", leaf.PublicKey)
	}
	for _, host := range []string{"127.0.0.1", "::1", "localhost"} {
		if err := leaf.VerifyHostname(host); err != nil {
			t.Errorf("certificate not valid for %s: %v", host, err)
		}
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > 25*time.Hour || !leaf.NotAfter.After(time.Now()) {
		t.Errorf("certificate valid from %v to %v", leaf.NotBefore, leaf.NotAfter)
	}

	// A client without the pool rejects the certificate: the TLS is real.
	if _, _, err := tlsGet(t, tlsTransport(t, nil, true), base+"/api/v1/healthz"); !errors.As(err, new(x509.UnknownAuthorityError)) {
		t.Errorf("client without the returned roots: err %v, want an unknown authority error", err)
	}
	// HTTP/1.1 over TLS is offered too.
	resp, _, err = tlsGet(t, tlsTransport(t, roots, false), base+"/api/v1/healthz")
	if err != nil {
		t.Fatalf("HTTP/1.1 client: %v", err)
	}
	if resp.ProtoMajor != 1 || resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP/1.1 client: %s %d", resp.Proto, resp.StatusCode)
	}

	// Each call has its own certificate: the first pool does not trust the second listener.
	base2, roots2, err := srv.ListenTLS(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatalf("second ListenTLS: %v", err)
	}
	if _, _, err := tlsGet(t, tlsTransport(t, roots, true), base2+"/api/v1/healthz"); !errors.As(err, new(x509.UnknownAuthorityError)) {
		t.Errorf("first pool against the second listener: err %v, want an unknown authority error", err)
	}
	if _, _, err := tlsGet(t, tlsTransport(t, roots2, true), base2+"/api/v1/healthz"); err != nil {
		t.Fatalf("second listener with its own pool: %v", err)
	}

	// Close stops the TLS listeners like Listen's.
	srv.Close()
	if _, _, err := tlsGet(t, tlsTransport(t, roots, true), base+"/api/v1/healthz"); err == nil {
		t.Fatal("request succeeded after Close")
	}
}

// TestListenTLSStopsWithContext: the listener of ListenTLS closes when its ctx is done, as
// Listen's does, while the server keeps running.
func TestListenTLSStopsWithContext(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{APIKeys: []string{testKey}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(t.Context())
	base, roots, err := srv.ListenTLS(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("ListenTLS: %v", err)
	}
	if _, _, err := tlsGet(t, tlsTransport(t, roots, true), base+"/api/v1/healthz"); err != nil {
		t.Fatalf("healthz before cancel: %v", err)
	}
	cancel()
	eventually(t, "the TLS listener to close", func() bool {
		tr := tlsTransport(t, roots, true)
		defer tr.CloseIdleConnections()
		_, _, err := tlsGet(t, tr, base+"/api/v1/healthz")
		return err != nil
	})
	if srv.isClosed() {
		t.Fatal("cancelling the listen context closed the server")
	}
}

// TestListenTLSWithCertRejectsEmptyCertificate: a certificate without a key is refused up front.
func TestListenTLSWithCertRejectsEmptyCertificate(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if _, err := srv.ListenTLSWithCert(t.Context(), "127.0.0.1:0", tls.Certificate{}); err == nil {
		t.Fatal("an empty certificate was accepted")
	}
}

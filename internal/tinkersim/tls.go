package tinkersim

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// selfSignedValidity is how long the certificate of ListenTLS is valid.
const selfSignedValidity = 24 * time.Hour

// ListenTLS is Listen over HTTPS: it serves s on addr (e.g. "127.0.0.1:0") in the background
// until ctx is done or the server is closed, offering HTTP/2 by ALPN next to HTTP/1.1 as the
// real service does (§1.4). The certificate is self-signed, generated in memory for this call
// (ECDSA P-256, valid for 24 hours for 127.0.0.1, ::1 and localhost, so listen on a loopback
// address); roots trusts it and nothing else, for the RootCAs of a client's tls.Config. The
// base URL is e.g. "https://127.0.0.1:41234".
func (s *Server) ListenTLS(ctx context.Context, addr string) (baseURL string, roots *x509.CertPool, err error) {
	cert, err := SelfSignedCert()
	if err != nil {
		return "", nil, fmt.Errorf("tinkersim listen tls: %w", err)
	}
	baseURL, err = s.ListenTLSWithCert(ctx, addr, cert)
	if err != nil {
		return "", nil, err
	}
	roots = x509.NewCertPool()
	roots.AddCert(cert.Leaf)
	return baseURL, roots, nil
}

// ListenTLSWithCert is ListenTLS with the caller's certificate (e.g. from
// tls.LoadX509KeyPair): it serves s over HTTPS, HTTP/2 offered (§1.4), on addr until ctx is
// done or the server is closed, and returns the base URL, e.g. "https://127.0.0.1:41234".
func (s *Server) ListenTLSWithCert(ctx context.Context, addr string, cert tls.Certificate) (string, error) {
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		return "", errors.New("tinkersim listen tls: certificate or private key missing")
	}
	return s.listen(ctx, addr, &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
}

// SelfSignedCert generates the kind of certificate ListenTLS serves: a fresh ECDSA P-256 key
// and a self-signed certificate for 127.0.0.1, ::1 and localhost, valid for 24 hours, with
// Leaf set (add it to a CertPool to trust it). For a simulator in another process, started
// with ListenTLSWithCert or cmd/tinkersim's -tls-cert and -tls-key.
func SelfSignedCert() (tls.Certificate, error) {
	return selfSignedCert(time.Now())
}

// selfSignedCert generates a fresh ECDSA P-256 key and a self-signed certificate for the
// loopback names, valid from a minute before now (clock skew) for selfSignedValidity.
func selfSignedCert(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"tinkersim"}, CommonName: "tinkersim self-signed"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(selfSignedValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // its own trust anchor, like httptest's certificate
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parse certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

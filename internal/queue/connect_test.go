package queue

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// startServer runs a nats-server with opts (random port, no JetStream) for the test.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
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

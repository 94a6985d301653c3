package tinker_test

import (
	"context"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// After a bare 400 replaced the pool while another request was in flight on the old
// connection, Close must release that connection once it is idle, as it did before.
func TestCloseReleasesThePoolABare400Replaced(t *testing.T) {
	sim, err := tinkersim.New(tinkersim.Config{APIKeys: []string{simKey}, LongPollWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	ts := httptest.NewUnstartedServer(sim)
	ts.Config.ConnState = func(c net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch s {
		case http.StateNew:
			open[c] = true
		case http.StateClosed, http.StateHijacked:
			delete(open, c)
		}
	}
	ts.EnableHTTP2 = true
	ts.StartTLS()
	defer func() { ts.Close(); sim.Close() }()
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := tinker.Dial(ctx, tinker.Config{BaseURL: ts.URL, APIKey: simKey, RootCAs: roots,
		Timing: tinker.Timing{SubmitRetryBase: 10 * time.Millisecond, SubmitRetryMax: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatal(err)
	}
	hold, _ := sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultNeverComplete, Count: 1})
	held := make(chan error, 1)
	hctx, hcancel := context.WithCancel(ctx)
	go func() { _, err := s.Sample(hctx, simRequest(1)); held <- err }()
	for sim.Stats().Requests["asample"][http.StatusOK] == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	sim.RemoveFault(hold)
	if _, err := sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultBare400, Endpoints: []string{"asample"}, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(ctx, simRequest(2)); err != nil {
		t.Fatal(err)
	}
	hcancel()
	<-held
	time.Sleep(300 * time.Millisecond)
	c.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		mu.Lock()
		n := len(open)
		mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connection(s) still open 3 s after Close (the replaced pool's stays until IdleConnTimeout, 90 s)", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

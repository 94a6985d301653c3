package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestHelpDocumentsEveryFlag(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(t.Context(), []string{"-h"}, env(nil), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h: %v", err)
	}
	for _, name := range []string{"addr", "api-key", "admin-token", "capacity", "base-latency", "per-token-latency",
		"long-poll-wait", "retry-after", "result-ttl", "model", "seed", "min-gen-tokens", "token-min", "token-max",
		"stop-token-prob", "default-max-tokens", "max-num-samples", "metadata-threshold", "no-dynamic-config",
		"training-runs", "fault", "shutdown-timeout", "log-level", "TINKERSIM_API_KEYS"} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("-h does not mention %s", name)
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
	for _, bad := range [][]string{{"-model", "nocontext"}, {"-fault", "kind=nope"}, {"stray"}} {
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
	logs := &syncBuffer{}
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

package backoff

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestPausesReadsEveryAccountInServerTime: a reader outside the fleet sees each account's
// deadline, how far ahead of the server's clock it lies (or how long ago it passed) and why,
// and not the capacity reports kept in the same bucket.
func TestPausesReadsEveryAccountInServerTime(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	_, js := connect(t, s.ClientURL())
	ctx := ctxT(t)
	if got, err := Pauses(ctx, js, DefaultBucket); err != nil || got != nil {
		t.Fatalf("before any bucket: %v, %v; want none", got, err)
	}

	paused := open(t, js, Config{Account: "acct-paused"})
	if err := paused.Signal(ctx, ReasonBilling, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ended := open(t, js, Config{Account: "acct-ended"})
	if err := ended.Signal(ctx, ReasonRateLimited, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// A capacity report (internal/share) is JSON too, under a key with dots.
	kv, err := js.KeyValue(ctx, DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "acct-paused.share.0011", []byte(`{"running":3}`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)

	got, err := Pauses(ctx, js, DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d pauses, want the 2 accounts': %+v", len(got), got)
	}
	by := map[string]Pause{}
	for _, p := range got {
		by[p.Account] = p
	}
	if p := by["acct-paused"]; p.Reason != ReasonBilling || p.Left < 29*time.Second || p.Left > 30*time.Second {
		t.Errorf("paused account: %+v, want billing with 29-30 s left", p)
	}
	if p := by["acct-ended"]; p.Reason != ReasonRateLimited || p.Left > -200*time.Millisecond || p.Left < -10*time.Second {
		t.Errorf("ended account: %+v, want rate_limited, passed 0.25 s or more ago", p)
	}

	// The reader leaves no consumer behind on the bucket's stream.
	st, err := js.Stream(ctx, "KV_"+DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	before := consumers(t, st)
	for range 5 {
		if _, err := Pauses(ctx, js, DefaultBucket); err != nil {
			t.Fatal(err)
		}
	}
	if after := consumers(t, st); after > before {
		t.Errorf("%d consumers on the bucket after 5 reads, %d before", after, before)
	}
}

func consumers(t *testing.T, st jetstream.Stream) int {
	t.Helper()
	info, err := st.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

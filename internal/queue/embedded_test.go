package queue

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAnExistingStoreOnlyWhenAsked: with Existing, a data directory no server has used is
// refused and left unmade (a command that only reads, run in the wrong folder); one a
// server has used starts.
func TestAnExistingStoreOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	if _, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Port: -1, Existing: true}); !errors.Is(err, ErrNoDataDir) {
		t.Fatalf("on a folder that does not exist: %v, want ErrNoDataDir", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the refused start made %s (%v)", dir, err)
	}
	first, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	first.Shutdown()
	again, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Port: -1, Existing: true})
	if err != nil {
		t.Fatalf("on a store a server has used: %v", err)
	}
	again.Shutdown()
}

// TestAPortInUseIsSaidAtOnce: an embedded server given a port another process listens on
// (a second worker --embedded-nats, a nats-server on 4222) fails at once and names the port;
// it waited 30 s and said only that it was not ready.
func TestAPortInUseIsSaidAtOnce(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	start := time.Now()
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Port: port})
	if err == nil {
		emb.Shutdown()
		t.Fatal("started on a port another listener holds")
	}
	if took := time.Since(start); took > 5*time.Second || !strings.Contains(err.Error(), fmt.Sprintf("127.0.0.1:%d", port)) {
		t.Fatalf("after %v: %v; want the port named at once", took, err)
	}
}

// TestTheEmbeddedStoreGrowsAsTheDiskFreesUp: the embedded server sizes its store at three
// quarters of the room on its disk, and when the store is full and room frees up on the disk
// (files deleted), it takes writes again without a restart. nats-server alone fixes the
// size as it starts: a full local run stayed stuck until it was run again.
func TestTheEmbeddedStoreGrowsAsTheDiskFreesUp(t *testing.T) {
	t.Parallel()
	// A disk of size bytes that holds the store alone: what the store's files take is not free.
	var size atomic.Int64
	size.Store(1 << 20) // a store of 768 KiB
	disk := func(dir string) (int64, error) { return max(size.Load()-dirSize(dir), 0), nil }
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Port: -1, disk: disk, followEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	b := setupOn(t, emb.ClientURL(), Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	result := make([]byte, 1024)
	var refused error
	stored := 0
	for ; refused == nil; stored++ {
		if stored == 2000 {
			t.Fatal("2,000 results of 1 KiB went into a store sized for a disk with 1 MiB free")
		}
		_, refused = b.q.JS.Publish(ctx, b.q.Names.ResultSubject("b", fmt.Sprint(stored)), result)
	}
	if !StoreFull(refused) {
		t.Fatalf("the store refused a result with %v, want a full store's refusal", refused)
	}
	if stored < 500 {
		t.Fatalf("the store took %d results of 1 KiB, want about 768 KiB's worth", stored)
	}
	time.Sleep(100 * time.Millisecond) // several looks at the disk: nothing freed, no growth
	if _, err := b.q.JS.Publish(ctx, b.q.Names.ResultSubject("b", "still full"), result); !StoreFull(err) {
		t.Fatalf("a result with no room freed on the disk: %v, want a full store's refusal", err)
	}

	size.Add(2 << 20) // another program deleted 2 MiB of its files
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := b.q.JS.Publish(ctx, b.q.Names.ResultSubject("b", "room"), result)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a result 10 s after 2 MiB were freed on the disk: %v", err)
		}
	}
}

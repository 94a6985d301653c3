//go:build unix

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestListOfARealStoreIsNotLostToASimulatedRunStarting: the local store holds a real batch,
// and a submit --local --simulate run is starting in the same folder (its store locked, its
// server not up yet, so the lock file names no URL). list prints the real batch and says the
// simulated ones are not listed, rather than fail and print none.
func TestListOfARealStoreIsNotLostToASimulatedRunStarting(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: data, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	env := quietEnv()
	if err := run(context.Background(), []string{"--nats-url", emb.ClientURL(), "--batch-id", "b-real", "--progress", "none", writeLines(t, jobLines(2))}, env); err != nil {
		t.Fatal(err)
	}
	emb.Shutdown()
	// A --simulate run that has locked its store and not yet started its server.
	// (An earlier --simulate run made the store.)
	sim := simulatedDataDir(data)
	semb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: sim, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	semb.Shutdown()
	f, err := os.OpenFile(filepath.Join(sim, "tinkerfleet.lock"), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("12345\n"), 0); err != nil {
		t.Fatal(err)
	}

	var out, errOut strings.Builder
	err = run(context.Background(), []string{"list", "--data-dir", data}, &environment{getenv: env.getenv, stdin: strings.NewReader(""), stdout: &out, stderr: &errOut})
	if err != nil || !strings.Contains(out.String(), "b-real") || !strings.Contains(errOut.String(), "the --simulate runs' batches in "+sim+" are not listed") {
		t.Fatalf("list: err %v, stdout %q, stderr %q: want b-real listed, and a note that the --simulate store cannot be read now", err, out.String(), errOut.String())
	}
}

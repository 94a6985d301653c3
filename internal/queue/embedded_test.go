package queue

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
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

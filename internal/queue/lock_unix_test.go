//go:build unix

package queue

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestEmbeddedServersDoNotShareADataDirectory: nats-server does not lock its store, so a
// second embedded server on the same directory (a second submit --local in the same folder)
// would write the first one's block files. It is refused, saying by whom and where the first
// serves; once the first is down the directory is free again.
func TestEmbeddedServersDoNotShareADataDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	second, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Port: -1})
	if err == nil {
		second.Shutdown()
		first.Shutdown()
		t.Fatal("a second embedded server started on the same data directory")
	}
	if !strings.Contains(err.Error(), dir+" is in use by another process (pid "+strconv.Itoa(os.Getpid())+")") {
		t.Fatalf("second server: %v", err)
	}
	// It says where the first serves, for a command that only reads to connect to.
	var inUse *DataDirInUseError
	if !errors.As(err, &inUse) || inUse.URL != first.ClientURL() {
		t.Fatalf("second server: %#v, want a *DataDirInUseError with the first's URL %s", err, first.ClientURL())
	}
	first.Shutdown()
	again, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Port: -1})
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	again.Shutdown()
}

// TestALargeLockFileIsNotReadWhole: the lock file of a data directory in use says by whom (a
// pid and a URL, a few dozen bytes); a file grown large there (a mistake, a disk error, a
// hostile writer) is read no further than that, not whole into memory.
func TestALargeLockFileIsNotReadWhole(t *testing.T) {
	dir := t.TempDir()
	held, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer held.release()
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("42\nnats://127.0.0.1:4222\n"), 0)
	if err == nil {
		err = f.Truncate(256 << 20) // sparse: no disk taken
	}
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = lockDataDir(dir)
	runtime.ReadMemStats(&after)
	var inUse *DataDirInUseError
	if !errors.As(err, &inUse) || inUse.PID != "42" || inUse.URL != "nats://127.0.0.1:4222" {
		t.Fatalf("lockDataDir: %#v, want the directory in use by pid 42 at its URL", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("reading whose the directory is allocated %d bytes", alloc)
	}
}

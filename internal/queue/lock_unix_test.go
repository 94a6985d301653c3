//go:build unix

package queue

import (
	"errors"
	"os"
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

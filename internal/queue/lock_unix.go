//go:build unix

package queue

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockDataDir takes an exclusive lock on dir for this process, held until release is called
// (or the process ends, which the kernel releases it with). nats-server does not lock its
// store, and two servers on one store write the same block files: a second `submit --local`
// in the same directory would corrupt the first's batches. Only a lock held elsewhere is an
// error; where the file system has no locks, dir is used unlocked.
func lockDataDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, "tinkerfleet.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			// A file system without locks (some network mounts: ENOLCK, EOPNOTSUPP) runs
			// as it did before the lock: refusing to start there would cost more.
			return func() {}, nil
		}
		who := "another process"
		if pid := strings.TrimSpace(string(holder)); pid != "" {
			who += " (pid " + pid + ")"
		}
		return nil, fmt.Errorf("%s is in use by %s: wait for it to end, or give this one a data directory of its own", dir, who)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, nil // closing the file releases the lock
}

//go:build unix

package queue

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockFileName is the file in a data directory that its embedded server's process locks.
const lockFileName = "tinkerfleet.lock"

// maxLockFile bounds what is read of a lock file held by another process: its pid and its
// server's URL take a few dozen bytes, and a file grown large is not read whole.
const maxLockFile = 4 << 10

// lockDataDir takes an exclusive lock on dir for this process, held until release is called
// (or the process ends, which the kernel releases it with). nats-server does not lock its
// store, and two servers on one store write the same block files: a second `submit --local`
// in the same directory would corrupt the first's batches. Only a lock held elsewhere is an
// error (a *DataDirInUseError); where the file system has no locks, dir is used unlocked.
func lockDataDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(f, maxLockFile)) // a pid and a URL: no more is read
		f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			// A file system without locks (some network mounts: ENOLCK, EOPNOTSUPP) runs
			// as it did before the lock: refusing to start there would cost more.
			return &dirLock{}, nil
		}
		return nil, inUse(dir, holder)
	}
	l := &dirLock{f: f}
	l.write(strconv.Itoa(os.Getpid()) + "\n")
	return l, nil
}

// dirLock is a data directory held by this process. Its file says by whom (the pid), and
// once the server is up where it serves (its client URL).
type dirLock struct {
	f *os.File // nil where the file system has no locks
}

// announce adds the server's client URL to the lock file, after the pid.
func (l *dirLock) announce(url string) {
	l.write(strconv.Itoa(os.Getpid()) + "\n" + url + "\n")
}

func (l *dirLock) write(s string) {
	if l.f == nil {
		return
	}
	if err := l.f.Truncate(0); err == nil {
		_, _ = l.f.WriteAt([]byte(s), 0)
	}
}

// release lets go of the directory: closing the file releases the lock.
func (l *dirLock) release() {
	if l.f != nil {
		_ = l.f.Close()
	}
}

// inUse reads a lock file's content: the pid, then the URL once the server is up.
func inUse(dir string, holder []byte) *DataDirInUseError {
	e := &DataDirInUseError{Dir: dir}
	lines := strings.Split(string(holder), "\n")
	e.PID = strings.TrimSpace(lines[0])
	if len(lines) > 1 {
		e.URL = strings.TrimSpace(lines[1])
	}
	return e
}

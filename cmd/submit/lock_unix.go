//go:build unix

package main

import (
	"errors"
	"os"
	"syscall"
)

// lockOutput takes an exclusive lock on f, an output file, held until f is closed; it reports
// false if another process holds one. Where the file system has no locks (some network mounts),
// the file is used unlocked, as before there was a lock.
func lockOutput(f *os.File) bool {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	return !errors.Is(err, syscall.EWOULDBLOCK)
}

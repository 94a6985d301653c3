//go:build linux || darwin || freebsd

package queue

import (
	"fmt"
	"syscall"
)

// diskFree is how many bytes of the file system of dir an unprivileged process may still
// write (statfs(2)'s available blocks, as nats-server reads them).
func diskFree(dir string) (int64, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	return int64(uint64(fs.Bavail) * uint64(fs.Bsize)), nil
}

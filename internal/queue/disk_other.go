//go:build !(linux || darwin || freebsd)

package queue

import "errors"

// diskFree cannot read a disk's free space here: the embedded server keeps nats-server's own
// sizing of its store (fixed as it starts).
func diskFree(string) (int64, error) {
	return 0, errors.New("free disk space is not read on this system")
}

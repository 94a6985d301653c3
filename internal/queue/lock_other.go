//go:build !unix

package queue

// lockDataDir does nothing where flock(2) is not available: keep one embedded server per data
// directory by hand there.
func lockDataDir(string) (*dirLock, error) { return &dirLock{}, nil }

// dirLock holds nothing where there are no locks.
type dirLock struct{}

func (*dirLock) announce(string) {}
func (*dirLock) release()        {}

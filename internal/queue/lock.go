package queue

import "fmt"

// DataDirInUseError says that another process runs an embedded server on the data directory,
// and where that server serves, so that a command that only reads or cancels can connect to
// it instead (submit status during a submit --local run).
type DataDirInUseError struct {
	// Dir is the data directory.
	Dir string
	// PID is the holder's process id, as its lock file says; empty if it says nothing.
	PID string
	// URL is the holder's NATS client URL; empty until its server is up.
	URL string
}

// Error says whose the directory is, and what to do.
func (e *DataDirInUseError) Error() string {
	who := "another process"
	if e.PID != "" {
		who += " (pid " + e.PID + ")"
	}
	return fmt.Sprintf("%s is in use by %s: wait for it to end, or give this one a data directory of its own", e.Dir, who)
}

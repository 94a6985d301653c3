//go:build !unix

package main

import "os"

// lockOutput does not lock where there is no flock: two processes may write one output file.
func lockOutput(*os.File) bool { return true }

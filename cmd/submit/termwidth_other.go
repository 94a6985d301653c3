//go:build !unix

package main

import "io"

// terminalWidth is 0 (not known) where there is no TIOCGWINSZ: lines are drawn whole.
func terminalWidth(io.Writer) int { return 0 }

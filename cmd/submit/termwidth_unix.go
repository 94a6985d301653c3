//go:build unix

package main

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// terminalWidth returns the width in columns of the terminal that w writes to, or 0 if w is
// no terminal or its width is not known. It is read at each drawing, so a terminal resized
// meanwhile is drawn to its new width.
func terminalWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	conn, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	width := 0
	_ = conn.Control(func(fd uintptr) {
		if ws, err := unix.IoctlGetWinsize(int(fd), unix.TIOCGWINSZ); err == nil {
			width = int(ws.Col)
		}
	})
	return width
}

package main

import (
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTerminalWidthReadsTheTerminal: terminalWidth reads the width of a real terminal (a
// pseudo-terminal set to 57 columns), and is 0 for a file that is none.
func TestTerminalWidthReadsTheTerminal(t *testing.T) {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	defer ptmx.Close()
	var n int
	conn, err := ptmx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ctlErr error
	if err := conn.Control(func(fd uintptr) {
		if ctlErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ctlErr == nil {
			n, ctlErr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
		}
	}); err != nil || ctlErr != nil {
		t.Skipf("cannot open the pseudo-terminal's other end: %v %v", err, ctlErr)
	}
	pts, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("cannot open the pseudo-terminal's other end: %v", err)
	}
	defer pts.Close()
	if err := unix.IoctlSetWinsize(int(pts.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: 57}); err != nil {
		t.Fatal(err)
	}
	if w := terminalWidth(pts); w != 57 {
		t.Fatalf("terminalWidth of a terminal 57 wide = %d", w)
	}
	f, err := os.CreateTemp(t.TempDir(), "notaterminal")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if w := terminalWidth(f); w != 0 {
		t.Fatalf("terminalWidth of a file = %d, want 0", w)
	}
}

package fleettest

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// WriteCutter is a nats.CustomDialer (pass nats.SetCustomDialer) whose connections can be made
// to fail a write as a socket does when its server goes away under it: the write returns
// "broken pipe" and the connection closes, so nats.go reconnects, through a new connection of
// the dialer that writes again.
type WriteCutter struct {
	cut atomic.Bool
}

// CutNextWrite makes the next write on any of the dialer's connections fail.
func (d *WriteCutter) CutNextWrite() { d.cut.Store(true) }

// Dial dials address on network, as a net.Dialer with a 5 s timeout does.
func (d *WriteCutter) Dial(network, address string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: c, d: d}, nil
}

// cutConn is a connection of a WriteCutter.
type cutConn struct {
	net.Conn
	d *WriteCutter
}

func (c *cutConn) Write(p []byte) (int, error) {
	if c.d.cut.CompareAndSwap(true, false) {
		c.Conn.Close()
		return 0, &net.OpError{Op: "write", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: syscall.EPIPE}
	}
	return c.Conn.Write(p)
}

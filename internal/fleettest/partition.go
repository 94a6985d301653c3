package fleettest

import (
	"net"
	"net/url"
	"os"
	"sync"
	"time"
)

// Partition is a nats.CustomDialer (pass nats.SetCustomDialer) whose links to a server can be
// cut as a dead network cuts them, not as a stopped server closes them: nothing is closed or
// refused. What the client writes vanishes into the socket's buffers, nothing it waits for
// arrives, and a new dial times out. Only the client's pings, left unanswered, can tell, or a
// write that waits for room in full buffers until its deadline.
type Partition struct {
	// SendBuffer is how many bytes a cut link still takes, as its socket's buffers do, before
	// a write waits until its deadline and fails (a timeout). Zero: the buffers never fill.
	SendBuffer int

	mu  sync.Mutex
	cut map[string]bool // host:port
}

// partitionDialWait is how long a dial to a cut address waits before it times out.
const partitionDialWait = time.Second

// Cut cuts every link to the server at url (nats://host:port), those open and those to come.
func (p *Partition) Cut(serverURL string) {
	u, err := url.Parse(serverURL)
	if err != nil {
		panic("fleettest: Partition.Cut: " + err.Error())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut == nil {
		p.cut = map[string]bool{}
	}
	p.cut[u.Host] = true
}

func (p *Partition) isCut(address string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut[address]
}

// Dial dials address on network, as a net.Dialer with a 5 s timeout does, unless the link
// to address is cut.
func (p *Partition) Dial(network, address string) (net.Conn, error) {
	if p.isCut(address) {
		time.Sleep(partitionDialWait)
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
	}
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &partitionConn{Conn: c, p: p, address: address, closed: make(chan struct{})}, nil
}

// partitionConn is a connection of a Partition.
type partitionConn struct {
	net.Conn
	p       *Partition
	address string
	once    sync.Once
	closed  chan struct{}

	mu       sync.Mutex
	deadline time.Time // of writes (SetWriteDeadline)
	buffered int       // bytes written since the link was cut
}

// Read drops what arrives once the link is cut, and then waits for the connection to close.
func (c *partitionConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.p.isCut(c.address) {
		<-c.closed
		return 0, net.ErrClosed
	}
	return n, err
}

// Write sends nothing once the link is cut, and says it did, until the Partition's
// SendBuffer bytes wait in the link: then it waits until its deadline and fails, having
// written nothing (nats.go closes a connection whose write failed part way by itself).
func (c *partitionConn) Write(b []byte) (int, error) {
	if !c.p.isCut(c.address) {
		return c.Conn.Write(b)
	}
	c.mu.Lock()
	full, deadline := c.p.SendBuffer > 0 && c.buffered >= c.p.SendBuffer, c.deadline
	if !full {
		c.buffered += len(b)
	}
	c.mu.Unlock()
	if !full {
		return len(b), nil
	}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case <-timeout:
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: os.ErrDeadlineExceeded}
	case <-c.closed:
		return 0, net.ErrClosed
	}
}

func (c *partitionConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *partitionConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *partitionConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

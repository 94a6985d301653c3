package fleettest

import (
	"net"
	"sync"
	"time"
)

// Stall is a nats.CustomDialer (pass nats.SetCustomDialer) whose connections can be stalled
// as a stopped process (SIGSTOP, a frozen container) or a long network hiccup stalls
// them: what the client writes waits, nothing is lost, and it all arrives, in order, once the
// stall ends. What the server sends still arrives meanwhile. A stall longer than the ack wait
// makes the server deliver the client's jobs again.
type Stall struct {
	mu      sync.Mutex
	stalled chan struct{} // closed when the stall ends; nil while not stalled
}

// Stall holds every write on the dialer's connections until Resume.
func (s *Stall) Stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalled == nil {
		s.stalled = make(chan struct{})
	}
}

// Resume lets the held writes go, in order.
func (s *Stall) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalled != nil {
		close(s.stalled)
		s.stalled = nil
	}
}

// wait returns once no stall is on.
func (s *Stall) wait() {
	s.mu.Lock()
	stalled := s.stalled
	s.mu.Unlock()
	if stalled != nil {
		<-stalled
	}
}

// Dial dials address on network, as a net.Dialer with a 5 s timeout does.
func (s *Stall) Dial(network, address string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, s: s}, nil
}

// stallConn is a connection of a Stall.
type stallConn struct {
	net.Conn
	s *Stall
}

func (c *stallConn) Write(p []byte) (int, error) {
	c.s.wait()
	return c.Conn.Write(p)
}

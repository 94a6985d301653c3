package queue

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// pipeDialer dials one end of a net.Pipe, whose writes wait for a reader as a full socket's do.
type pipeDialer struct{ conn net.Conn }

func (d pipeDialer) Dial(string, string) (net.Conn, error) { return d.conn, nil }

// TestAWriteThatTimesOutClosesItsConnection: once a write to a dead link has timed out, the
// next write (the ping timer's, in place, without a deadline) fails at once rather than wait
// out a second deadline, and the read loop ends, so the connection is dropped after one
// WriteTimeout whoever takes nats.go's lock first, and for the write's timeout.
func TestAWriteThatTimesOutClosesItsConnection(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	defer server.Close() // the peer never reads: the link is dead
	o := nats.GetDefaultOptions()
	o.CustomDialer = pipeDialer{client}
	if err := closeOnWriteTimeout(&o); err != nil {
		t.Fatal(err)
	}
	c, err := o.CustomDialer.Dial("tcp", "nats:4222")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("PUB a 1\r\nx\r\n")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write on a dead link: %v; want its deadline exceeded", err)
	}
	_ = c.SetWriteDeadline(time.Time{}) // as nats.go does after each write, ignoring the error

	wrote, read := make(chan error, 1), make(chan error, 1)
	go func() { _, err := c.Write([]byte("PING\r\n")); wrote <- err }()
	go func() { _, err := c.Read(make([]byte, 64)); read <- err }()
	for _, ch := range []struct {
		what string
		err  chan error
	}{{"the next write", wrote}, {"the read loop's read", read}} {
		select {
		case err := <-ch.err:
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("%s on a dead link: %v; want the timed-out write's error", ch.what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still waits on the dead link 5 s after a write timed out", ch.what)
		}
	}
}

// TestTheWriteTimeoutDialerKeepsTheInnerDialersTLSAnswer: a custom dialer whose connections
// are secure already (nats.go asks SkipTLSHandshake) is still asked through the wrapper.
func TestTheWriteTimeoutDialerKeepsTheInnerDialersTLSAnswer(t *testing.T) {
	t.Parallel()
	for _, skip := range []bool{false, true} {
		o := nats.GetDefaultOptions()
		o.CustomDialer = skipTLSDialer{skip}
		if err := closeOnWriteTimeout(&o); err != nil {
			t.Fatal(err)
		}
		s, ok := o.CustomDialer.(interface{ SkipTLSHandshake() bool })
		if !ok {
			t.Fatal("the wrapper does not answer SkipTLSHandshake")
		}
		if got := s.SkipTLSHandshake(); got != skip {
			t.Errorf("the inner dialer skips TLS: %v; the wrapper says %v", skip, got)
		}
	}
}

type skipTLSDialer struct{ skip bool }

func (d skipTLSDialer) Dial(string, string) (net.Conn, error) { return nil, errors.New("no network") }
func (d skipTLSDialer) SkipTLSHandshake() bool                { return d.skip }

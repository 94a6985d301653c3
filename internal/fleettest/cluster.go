package fleettest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// node is one nats-server of a test cluster; its options are kept so that it can be
// restarted on the same ports and store.
type node struct {
	name string
	opts *server.Options
	srv  *server.Server
}

// Cluster is a NATS JetStream cluster of embedded servers over loopback, for tests of
// failover: a node can be stopped and started again on the same ports and store.
type Cluster struct {
	t     testing.TB
	nodes []*node
}

// FreePorts returns n distinct loopback ports that were free a moment ago, for servers that
// must listen (or listen again, after a restart) on a port known in advance. They are drawn
// below the kernel's ephemeral range, so that the connections and ":0" listeners of tests
// running meanwhile, which take their ports from that range, cannot take one in between.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	low := ephemeralLow()
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			t.Fatalf("no free loopback port below %d after 1000 tries", low)
		}
		port := 10000 + rand.IntN(low-10000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // taken
		}
		lns = append(lns, ln)
		ports = append(ports, port)
	}
	return ports
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 where it cannot be
// read: Linux's default).
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11000 {
				low = v
			}
		}
	}
	return low
}

// StartCluster starts n clustered nats-servers with JetStream, each with its own store, and
// waits until JetStream has a meta leader. They are shut down at cleanup.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	ports := FreePorts(t, 2*n)
	var routes []string
	for i := range n {
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(ports[n+i]))
	}
	c := &Cluster{t: t}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		opts := &server.Options{
			ServerName:         name,
			Host:               "127.0.0.1",
			Port:               ports[i],
			NoLog:              true,
			NoSigs:             true,
			JetStream:          true,
			StoreDir:           t.TempDir(),
			JetStreamMaxMemory: 64 << 20,
			JetStreamMaxStore:  1 << 30,
			MaxPayload:         queue.DefaultMaxPayload,
			Cluster: server.ClusterOpts{
				Name: "tinkerfleet-test",
				Host: "127.0.0.1",
				Port: ports[n+i],
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		}
		c.nodes = append(c.nodes, &node{name: name, opts: opts})
	}
	for i := range c.nodes {
		c.Start(i)
	}
	t.Cleanup(c.shutdown)
	c.WaitMetaLeader()
	return c
}

// Start starts (or restarts) node i with its original options.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	srv, err := server.NewServer(nd.opts.Clone())
	if err != nil {
		c.t.Fatalf("node %s: %v", nd.name, err)
	}
	go srv.Start() // stopped by stop or shutdown
	if !srv.ReadyForConnections(30 * time.Second) {
		c.t.Fatalf("node %s not ready after 30s", nd.name)
	}
	nd.srv = srv
}

// Stop shuts node i down and waits until it has stopped.
func (c *Cluster) Stop(i int) {
	nd := c.nodes[i]
	if nd.srv == nil {
		return
	}
	nd.srv.Shutdown()
	nd.srv.WaitForShutdown()
	nd.srv = nil
}

func (c *Cluster) shutdown() {
	for i := range c.nodes {
		c.Stop(i)
	}
}

// Len is the number of nodes.
func (c *Cluster) Len() int { return len(c.nodes) }

// Name is the server name of node i.
func (c *Cluster) Name(i int) string { return c.nodes[i].name }

// Index returns the index of the node named name, or -1.
func (c *Cluster) Index(name string) int {
	for i, nd := range c.nodes {
		if nd.name == name {
			return i
		}
	}
	return -1
}

// URL returns the client URL of node i.
func (c *Cluster) URL(i int) string {
	return "nats://127.0.0.1:" + strconv.Itoa(c.nodes[i].opts.Port)
}

// URLs lists every node's client URL, node first first.
func (c *Cluster) URLs(first int) string {
	out := []string{c.URL(first)}
	for i := range c.nodes {
		if i != first {
			out = append(out, c.URL(i))
		}
	}
	return strings.Join(out, ",")
}

// WaitMetaLeader waits until a running node is the JetStream meta leader and every running
// node knows it.
func (c *Cluster) WaitMetaLeader() {
	c.t.Helper()
	Eventually(c.t, 30*time.Second, "a JetStream meta leader", func() bool {
		leaders := 0
		for _, nd := range c.nodes {
			if nd.srv == nil {
				continue
			}
			if !nd.srv.JetStreamIsCurrent() {
				return false
			}
			if nd.srv.JetStreamIsLeader() {
				leaders++
			}
		}
		return leaders == 1
	})
}

// Eventually polls cond every 50 ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Connect opens a connection named name to node first (falling back to the others in order)
// and sets the queue up with cfg.
func (c *Cluster) Connect(t testing.TB, first int, name string, cfg queue.Config) *queue.Queue {
	t.Helper()
	return Queue(t, c.URLs(first), cfg, nats.DontRandomize(), nats.Name(name))
}

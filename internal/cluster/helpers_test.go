package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// testKey is the Tinker API key the simulator accepts in these tests.
const testKey = fleettest.APIKey

// node is one nats-server of a test cluster; its options are kept so that it can be
// restarted on the same ports and store.
type node struct {
	name string
	opts *server.Options
	srv  *server.Server
}

// testCluster is a NATS JetStream cluster of embedded servers over loopback.
type testCluster struct {
	t     testing.TB
	nodes []*node
}

// freePorts returns n distinct free loopback ports. They are found by listening and closing,
// so another process could take one in between; on loopback in a test that is rare enough.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var (
		ports []int
		lns   []net.Listener
	)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	return ports
}

// startCluster starts n clustered nats-servers with JetStream, each with its own store, and
// waits until JetStream has a meta leader. They are shut down at cleanup.
func startCluster(t testing.TB, n int) *testCluster {
	t.Helper()
	ports := freePorts(t, 2*n)
	var routes []string
	for i := range n {
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(ports[n+i]))
	}
	c := &testCluster{t: t}
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
		c.start(i)
	}
	t.Cleanup(c.shutdown)
	c.waitMetaLeader()
	return c
}

// start starts (or restarts) node i with its original options.
func (c *testCluster) start(i int) {
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

// stop shuts node i down and waits until it has stopped.
func (c *testCluster) stop(i int) {
	nd := c.nodes[i]
	if nd.srv == nil {
		return
	}
	nd.srv.Shutdown()
	nd.srv.WaitForShutdown()
	nd.srv = nil
}

func (c *testCluster) shutdown() {
	for i := range c.nodes {
		c.stop(i)
	}
}

// index returns the index of the node named name, or -1.
func (c *testCluster) index(name string) int {
	for i, nd := range c.nodes {
		if nd.name == name {
			return i
		}
	}
	return -1
}

// url returns the client URL of node i.
func (c *testCluster) url(i int) string {
	return "nats://127.0.0.1:" + strconv.Itoa(c.nodes[i].opts.Port)
}

// urls lists every node's client URL, node first first.
func (c *testCluster) urls(first int) string {
	out := []string{c.url(first)}
	for i := range c.nodes {
		if i != first {
			out = append(out, c.url(i))
		}
	}
	return strings.Join(out, ",")
}

// waitMetaLeader waits until a running node is the JetStream meta leader and every running
// node knows it.
func (c *testCluster) waitMetaLeader() {
	c.t.Helper()
	eventually(c.t, 30*time.Second, "a JetStream meta leader", func() bool {
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

// eventually polls cond every 50 ms until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// connect opens a connection to node first (falling back to the others in order) and sets
// the queue up with cfg.
func (c *testCluster) connect(t testing.TB, first int, name string, cfg queue.Config) *queue.Queue {
	t.Helper()
	nc, err := queue.Connect(queue.ConnectConfig{URL: c.urls(first), Name: name}, nats.DontRandomize())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	q, err := queue.Setup(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// startSim serves a simulator over loopback HTTP and returns it with its base URL.
func startSim(t testing.TB, cfg tinkersim.Config) (*tinkersim.Server, string) {
	t.Helper()
	return fleettest.Sim(t, cfg)
}

// makeJobs returns n prompt-token jobs (no tokenizer needed) with custom ids job-00000….
func makeJobs(n int) []jobs.Job {
	maxTokens := 8
	out := make([]jobs.Job, n)
	for i := range out {
		out[i] = jobs.Job{
			CustomID:     fmt.Sprintf("job-%05d", i),
			Model:        "Qwen/Qwen3-8B",
			PromptTokens: []int{151644, 872, 198, 1000 + i},
			NumSamples:   1,
			Params:       jobs.SamplingParams{MaxTokens: &maxTokens},
		}
	}
	return out
}

// publishJobs publishes js in batch and waits for every ack (retrying through elections).
func publishJobs(t testing.TB, q *queue.Queue, batch string, js []jobs.Job) {
	t.Helper()
	fleettest.Publish(t, q, batch, js)
}

// readResults reads every stored result of batch and counts them per custom id (the value
// is how many result messages the stream holds for it).
func readResults(t testing.TB, q *queue.Queue, batch string) (map[string]int, map[string]jobs.Result) {
	t.Helper()
	results, counts := fleettest.Results(t, q, batch, 0, 0)
	return counts, results
}

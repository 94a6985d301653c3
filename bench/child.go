package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// childArg, as the first argument, makes the program a helper process of a comparison: a
// NATS server or a simulator (comparisons 1 and 2, so that their CPU is not counted in the
// worker's and their runtime is not the worker's), or a worker alone (comparison 1, as a
// fleet runs, and 5, so that its peak RSS is its own). The parent talks to it on
// stdin/stdout: the child prints one line ("ready" or its URL) when it is up and stops when
// its stdin is closed. A worker started with -hold runs only once the line "start" comes.
const childArg = "-bench-child"

// runChild is the helper process.
func runChild(args []string) error {
	fs := flag.NewFlagSet("bench-child", flag.ContinueOnError)
	role := fs.String("role", "", "nats, sim, worker or cost")
	natsURL := fs.String("nats", "", "NATS URL (worker)")
	simURL := fs.String("sim", "", "simulator URL (worker)")
	concurrency := fs.Int("concurrency", 400, "job slots (worker)")
	maxAckPending := fs.Int("max-ack-pending", 1000, "consumer MaxAckPending (worker)")
	capacity := fs.Int("capacity", 100_000, "simulator capacity (sim)")
	latency := fs.Duration("latency", 0, "simulator BaseLatency (sim)")
	tlsCert := fs.String("tls-cert", "", "serve HTTPS with this PEM certificate (sim)")
	tlsKey := fs.String("tls-key", "", "PEM key of -tls-cert (sim)")
	side := fs.String("side", "", "client or worker (cost: a side of comparison 2, for -instructions)")
	setupOnly := fs.Bool("setup-only", false, "set up as for the samples, then stop (cost)")
	maxTokens := fs.Int("max-tokens", benchMaxTokens, "max_tokens of every sample (cost)")
	hold := fs.Bool("hold", false, "once ready, wait for the line \"start\" on stdin before running (worker)")
	profile := fs.String("cpuprofile-prefix", "", "write a CPU profile to `prefix`.<role>.<pid>")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *profile != "" {
		stop, err := startCPUProfile(fmt.Sprintf("%s.%s.%d", *profile, *role, os.Getpid()))
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer stop()
	}
	// The parent closing stdin (or dying) ends the child, and nothing else does: an interrupt
	// (Ctrl-C reaches the whole process group) would kill it before it cleans up, the NATS
	// child's store left in the temporary directory. The parent closes stdin when it is
	// interrupted (startChild).
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdinDone, started := make(chan struct{}), make(chan struct{})
	go func() { // ends with stdin: owned by the parent's pipe.
		in, unstarted := bufio.NewScanner(os.Stdin), started
		for in.Scan() {
			if in.Text() == startLine && unstarted != nil {
				close(unstarted)
				unstarted = nil
			}
		}
		close(stdinDone)
		cancel()
	}()
	switch *role {
	case "nats":
		dir, err := os.MkdirTemp("", "tinkerfleet-bench-nats-*")
		if err != nil {
			return fmt.Errorf("temp dir: %w", err)
		}
		defer os.RemoveAll(dir)
		emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: dir, Port: -1})
		if err != nil {
			return err
		}
		fmt.Println(emb.ClientURL())
		<-stdinDone
		emb.Shutdown()
		return nil
	case "sim":
		sim, err := tinkersim.New(tinkersim.Config{APIKeys: []string{string(benchKey)}, Capacity: *capacity, BaseLatency: *latency})
		if err != nil {
			return err
		}
		var url string
		if *tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
			if err != nil {
				return fmt.Errorf("sim key pair: %w", err)
			}
			url, err = sim.ListenTLSWithCert(ctx, "127.0.0.1:0", cert)
			if err != nil {
				return err
			}
		} else if url, err = sim.Listen(ctx, "127.0.0.1:0"); err != nil {
			return err
		}
		fmt.Println(url)
		<-stdinDone
		sim.Close()
		return nil
	case "worker":
		nc, err := queue.Connect(queue.ConnectConfig{URL: *natsURL, Name: "bench-child-worker"})
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
		q, err := queue.Setup(ctx, js, queue.Config{MaxAckPending: *maxAckPending})
		if err != nil {
			return err
		}
		// The tokenizer is loaded before "ready", as workers in one process share one loaded
		// tokenizer: loaded at each worker's first job, it brought workers started together
		// into the work up to a second apart, and each that joins a fleet running at the
		// capacity costs the fleet a pause to learn its part (comparison 1).
		tokens := tokenizer.NewRegistry(tokenizer.Options{Offline: true})
		if _, err := tokens.ForModel(ctx, benchModel); err != nil {
			return err
		}
		w, err := worker.Open(ctx, worker.Config{
			Queue: q, TinkerBaseURL: *simURL, TinkerAPIKey: benchKey, Concurrency: *concurrency,
			Tokenizers: tokens, ShutdownGrace: 500 * time.Millisecond,
		})
		if err != nil {
			return err
		}
		defer w.Close()
		fmt.Println("ready")
		if *hold {
			select {
			case <-started:
			case <-stdinDone:
				return nil
			}
		}
		if err := w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("worker run: %w", err)
		}
		return nil
	case "cost":
		return runCostSide(ctx, *side, *setupOnly, *maxTokens)
	default:
		return fmt.Errorf("unknown role %q", *role)
	}
}

// child is a running helper process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	first string // the line it printed when ready
}

// startChild re-executes this program as a helper with args and waits for its first line.
// A profile prefix (bench -cpuprofile) has the child profile itself to prefix.<role>.<pid>.
func startChild(ctx context.Context, profile string, args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("child: own executable: %w", err)
	}
	if profile != "" {
		args = append(args, "-cpuprofile-prefix", profile)
	}
	cmd := exec.CommandContext(ctx, exe, append([]string{childArg}, args...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("child: %w", err)
	}
	// Cancelled, the child is stopped as stop does, so that it cleans up; killed only if it
	// has not exited 10 s later.
	cmd.Cancel = stdin.Close
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("child: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("child: start: %w", err)
	}
	c := &child{cmd: cmd, stdin: stdin}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = c.stop()
		return nil, fmt.Errorf("child %v: no ready line: %w", args, err)
	}
	c.first = strings.TrimSpace(line)
	return c, nil
}

// startLine tells a worker child started with -hold to run.
const startLine = "start"

// start tells a worker child started with -hold to run.
func (c *child) start() error {
	if _, err := io.WriteString(c.stdin, startLine+"\n"); err != nil {
		return fmt.Errorf("child: start: %w", err)
	}
	return nil
}

// stop closes the child's stdin and waits for it to exit (killing it after 10 s).
func (c *child) stop() error {
	_ = c.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }() // ends when the process exits (killed below at worst).
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		return <-done
	}
}

// stopAll stops children together (each stop waits for its child's exit) and returns their
// errors joined.
func stopAll(cs []*child) error {
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { errs[i] = c.stop() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// procStatus reads fields such as VmHWM and VmRSS (in kB) from /proc/<pid>/status.
func procStatus(pid int, fields ...string) (map[string]int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("proc status: %w", err)
	}
	out := map[string]int64{}
	for line := range strings.SplitSeq(string(data), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for _, f := range fields {
			if name == f {
				v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err != nil {
					return nil, fmt.Errorf("proc status %s: %w", f, err)
				}
				out[f] = v
			}
		}
	}
	return out, nil
}

// procCPU is a process's user+system CPU time from /proc/<pid>/stat (clock ticks of 10 ms).
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("proc stat: %w", err)
	}
	// The command name may hold spaces; fields after its closing paren are fixed.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("proc stat: too few fields")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("proc stat: %w", err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// startTLSSim starts a simulator child serving HTTPS on a fresh self-signed certificate
// (written to dir for it) and returns it with the roots that trust it.
func startTLSSim(ctx context.Context, profile, dir string, args ...string) (*child, *x509.CertPool, error) {
	cert, err := tinkersim.SelfSignedCert()
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return nil, nil, fmt.Errorf("tls sim: key: %w", err)
	}
	certFile, keyFile := filepath.Join(dir, "sim-cert.pem"), filepath.Join(dir, "sim-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		return nil, nil, fmt.Errorf("tls sim: %w", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		return nil, nil, fmt.Errorf("tls sim: %w", err)
	}
	c, err := startChild(ctx, profile, append([]string{"-role", "sim", "-tls-cert", certFile, "-tls-key", keyFile}, args...)...)
	if err != nil {
		return nil, nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert.Leaf)
	return c, roots, nil
}

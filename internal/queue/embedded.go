package queue

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedConfig configures the in-process nats-server of the single-machine mode.
type EmbeddedConfig struct {
	// DataDir holds the JetStream file store. Required: the point is that work survives a restart.
	DataDir string
	// Host to listen on; default 127.0.0.1 (the embedded server is not meant to face a network).
	Host string
	// Port to listen on; 0 means the NATS default 4222, -1 a random free port.
	Port int
	// MaxPayload is the largest message the server accepts; default 8 MiB so that big results fit.
	MaxPayload int32
	// Logs turns on the server's own log output (to stderr).
	Logs bool
	// Existing refuses, with ErrNoDataDir, a data directory no embedded server has used: a
	// command that only reads must not make a store where nothing was submitted.
	Existing bool
}

// ErrNoDataDir is StartEmbedded's error, with EmbeddedConfig.Existing, for a data directory no
// embedded server has used.
var ErrNoDataDir = errors.New("no tinkerfleet data directory")

// DefaultMaxPayload is the max payload of the embedded server: results up to this size are
// accepted; the worker compresses larger ones and replaces any that still do not fit.
const DefaultMaxPayload = 8 << 20

// Embedded is a running in-process nats-server with JetStream on disk.
type Embedded struct {
	srv  *server.Server
	lock *dirLock // the data directory, held while the server runs
}

// StartEmbedded starts a nats-server with JetStream in cfg.DataDir and waits until it accepts
// connections. A data directory the server of another process holds is refused with a
// *DataDirInUseError, which says where that server serves once it is up.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedded nats: a data directory is required")
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: data directory: %w", err)
	}
	// nats-server keeps its JetStream store in a "jetstream" folder of StoreDir.
	if _, err := os.Stat(filepath.Join(dir, "jetstream")); cfg.Existing && errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", ErrNoDataDir, dir)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded nats: data directory: %w", err)
	}
	lock, err := lockDataDir(dir)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			lock.release()
		}
	}()
	opts := &server.Options{
		ServerName:         "tinkerfleet-embedded",
		Host:               cfg.Host,
		Port:               cfg.Port,
		JetStream:          true,
		StoreDir:           dir,
		MaxPayload:         cfg.MaxPayload,
		NoLog:              !cfg.Logs,
		NoSigs:             true,
		JetStreamMaxMemory: 256 << 20,
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.MaxPayload == 0 {
		opts.MaxPayload = DefaultMaxPayload
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if cfg.Logs {
		srv.ConfigureLogger()
	}
	go srv.Start() // owned by Embedded: Shutdown stops it.
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready after 30s (data dir %s)", dir)
	}
	lock.announce(srv.ClientURL())
	ok = true
	return &Embedded{srv: srv, lock: lock}, nil
}

// ClientURL is the URL clients connect to.
func (e *Embedded) ClientURL() string { return e.srv.ClientURL() }

// Server exposes the running server, for tests that need to stop or inspect it.
func (e *Embedded) Server() *server.Server { return e.srv }

// Shutdown stops the server, waits until it has stopped and releases the data directory.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.lock.release()
}

package queue

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
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

	// disk reads the free space of DataDir's file system (nil: diskFree), and followEvery is
	// how often the store's size follows it (0: followDiskEvery). Tests fill a disk with them.
	disk        func(dir string) (int64, error)
	followEvery time.Duration
}

// followDiskEvery is how often an embedded server's store size follows its disk's free space.
const followDiskEvery = 5 * time.Second

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

	// The store's size, while it follows the disk (see followDisk).
	dir      string
	base     server.Options // the options the server started with, to reload with a new size
	maxStore int64          // the size now; 0: nats-server's own, fixed as it started
	disk     func(dir string) (int64, error)
	stop     chan struct{} // closed by Shutdown: followDisk returns
	stopOnce sync.Once
	followed chan struct{} // closed when followDisk has returned
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
	disk := cfg.disk
	if disk == nil {
		disk = diskFree
	}
	if free, err := disk(dir); err == nil {
		opts.JetStreamMaxStore = storeSize(free, dirSize(filepath.Join(dir, "jetstream")))
	}
	if opts.Port >= 0 {
		// nats-server keeps a listen error to itself (its log is off): a port another process
		// holds (a worker --embedded-nats, a nats-server) made ReadyForConnections wait its
		// 30 s and fail without saying why. Asked first, the listen error is said at once.
		hp := net.JoinHostPort(opts.Host, strconv.Itoa(cmp.Or(opts.Port, server.DEFAULT_PORT)))
		l, err := net.Listen("tcp", hp)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: cannot serve on %s (another process may serve there): %w", hp, err)
		}
		l.Close()
	}
	base := *opts // before NewServer fills in its defaults, as ReloadOptions does again
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
	e := &Embedded{srv: srv, lock: lock, dir: dir, base: base, maxStore: opts.JetStreamMaxStore, disk: disk,
		stop: make(chan struct{}), followed: make(chan struct{})}
	if e.maxStore > 0 {
		go e.followDisk(cmp.Or(cfg.followEvery, followDiskEvery)) // owned by e: Shutdown stops it
	} else {
		close(e.followed)
	}
	return e, nil
}

// storeSize is the size the embedded server gives its store: three quarters of the room the
// store has on its disk, what its files take (used) and what is free, as nats-server sizes a
// store it is given no size for. Writing to the store moves bytes from free to used, so the
// size stays put as the store fills, and a quarter of the disk stays free for everything else.
// nats-server fixes its own size as it starts, and refuses to change it while it runs; a
// size given explicitly can be raised (see followDisk).
func storeSize(free, used int64) int64 { return (free + used) / 4 * 3 }

// followDisk raises the store's size, every period until Shutdown, while room frees up on
// its disk (files deleted, a disk grown), so that a store that ran out of room takes writes
// again without a restart: the results a worker holds for want of room are stored, and a
// local run goes on. nats-server does not shrink a store while it runs, so a disk that other
// programs fill leaves the size as it was.
func (e *Embedded) followDisk(period time.Duration) {
	defer close(e.followed)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		free, err := e.disk(e.dir)
		if err != nil || !e.srv.JetStreamEnabled() { // off after a write met a full disk
			continue
		}
		size := storeSize(free, dirSize(filepath.Join(e.dir, "jetstream")))
		if size <= e.maxStore+e.maxStore/100 { // not for every file another program writes
			continue
		}
		next := e.base
		next.JetStreamMaxStore = size
		if err := e.srv.ReloadOptions(&next); err != nil {
			continue // tried again next period: the server runs on with its size
		}
		e.maxStore = size
	}
}

// dirSize is the size of the files under dir (0 for none, or a directory it cannot read).
func dirSize(dir string) int64 {
	var size int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				size += info.Size()
			}
		}
		return nil
	})
	return size
}

// ClientURL is the URL clients connect to.
func (e *Embedded) ClientURL() string { return e.srv.ClientURL() }

// Server exposes the running server, for tests that need to stop or inspect it.
func (e *Embedded) Server() *server.Server { return e.srv }

// Shutdown stops the server, waits until it has stopped and releases the data directory. It
// may be called again.
func (e *Embedded) Shutdown() {
	e.stopOnce.Do(func() { close(e.stop) })
	<-e.followed
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.lock.release()
}

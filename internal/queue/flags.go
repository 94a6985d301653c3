package queue

import (
	"flag"
	"strconv"
	"time"
)

// Getenv reads an environment variable; os.Getenv in programs, a map in tests.
type Getenv func(string) string

// RegisterFlags defines the NATS connection flags on fs, each defaulting to its environment
// variable (see the configuration table in README.md).
func (c *ConnectConfig) RegisterFlags(fs *flag.FlagSet, getenv Getenv) {
	fs.StringVar(&c.URL, "nats-url", getenv("NATS_URL"), "NATS server URLs, comma-separated (env NATS_URL)")
	fs.StringVar(&c.CredsFile, "nats-creds", getenv("NATS_CREDS"), "NATS user credentials file (env NATS_CREDS)")
	fs.StringVar(&c.NKeyFile, "nats-nkey", getenv("NATS_NKEY"), "NATS NKey seed file (env NATS_NKEY)")
	fs.StringVar(&c.User, "nats-user", getenv("NATS_USER"), "NATS user name (env NATS_USER)")
	fs.StringVar(&c.Password, "nats-password", getenv("NATS_PASSWORD"), "NATS password; prefer the environment (env NATS_PASSWORD)")
	fs.StringVar(&c.Token, "nats-token", getenv("NATS_TOKEN"), "NATS token; prefer the environment (env NATS_TOKEN)")
	fs.StringVar(&c.TLSCA, "nats-tls-ca", getenv("NATS_TLS_CA"), "PEM file of CAs for the NATS servers' certificates (env NATS_TLS_CA)")
	fs.StringVar(&c.TLSCert, "nats-tls-cert", getenv("NATS_TLS_CERT"), "client certificate for NATS mutual TLS (env NATS_TLS_CERT)")
	fs.StringVar(&c.TLSKey, "nats-tls-key", getenv("NATS_TLS_KEY"), "client key for NATS mutual TLS (env NATS_TLS_KEY)")
}

// RegisterFlags defines the stream and consumer flags on fs, each defaulting to its
// environment variable.
func (c *Config) RegisterFlags(fs *flag.FlagSet, getenv Getenv) {
	fs.StringVar(&c.Prefix, "prefix", orDefault(getenv("TINKERFLEET_PREFIX"), DefaultPrefix), "subject prefix and name stem of streams and buckets (env TINKERFLEET_PREFIX)")
	fs.IntVar(&c.Replicas, "replicas", envInt(getenv, "TINKERFLEET_REPLICAS", 1), "replicas of streams and buckets: 1, or 3 on a cluster (env TINKERFLEET_REPLICAS)")
	fs.IntVar(&c.MaxAckPending, "max-ack-pending", envInt(getenv, "TINKERFLEET_MAX_ACK_PENDING", 1000), "fleet-wide cap on jobs in flight (env TINKERFLEET_MAX_ACK_PENDING)")
	fs.IntVar(&c.MaxDeliver, "max-deliver", envInt(getenv, "TINKERFLEET_MAX_DELIVER", 10), "deliveries of a job before it is dead-lettered (env TINKERFLEET_MAX_DELIVER)")
	fs.DurationVar(&c.AckWait, "ack-wait", envDuration(getenv, "TINKERFLEET_ACK_WAIT", 30*time.Second), "redelivery timeout of a job not heard from (env TINKERFLEET_ACK_WAIT)")
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func envInt(getenv Getenv, name string, def int) int {
	if v, err := strconv.Atoi(getenv(name)); err == nil {
		return v
	}
	return def
}

func envDuration(getenv Getenv, name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(getenv(name)); err == nil {
		return v
	}
	return def
}

package queue

import (
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
)

// RegisterFlags defines the NATS connection flags, each defaulting to its environment variable
// (see the configuration table in README.md).
func (c *ConnectConfig) RegisterFlags(s *envflag.Set) {
	s.Secret(&c.URL, "nats-url", "NATS_URL", "NATS server `URLs`, comma-separated")
	s.String(&c.CredsFile, "nats-creds", "NATS_CREDS", "", "NATS user credentials file")
	s.String(&c.NKeyFile, "nats-nkey", "NATS_NKEY", "", "NATS NKey seed file")
	s.String(&c.User, "nats-user", "NATS_USER", "", "NATS user name")
	s.Secret(&c.Password, "nats-password", "NATS_PASSWORD", "NATS `password`; prefer the environment")
	s.Secret(&c.Token, "nats-token", "NATS_TOKEN", "NATS `token`; prefer the environment")
	s.String(&c.TLSCA, "nats-tls-ca", "NATS_TLS_CA", "", "PEM file of CAs for the NATS servers' certificates")
	s.String(&c.TLSCert, "nats-tls-cert", "NATS_TLS_CERT", "", "client certificate for NATS mutual TLS")
	s.String(&c.TLSKey, "nats-tls-key", "NATS_TLS_KEY", "", "client key for NATS mutual TLS")
}

// RegisterFlags defines the stream and consumer flags, each defaulting to its environment
// variable.
func (c *Config) RegisterFlags(s *envflag.Set) {
	s.String(&c.Prefix, "prefix", "TINKERFLEET_PREFIX", DefaultPrefix, "subject prefix and name stem of streams and buckets")
	s.PositiveInt(&c.Replicas, "replicas", "TINKERFLEET_REPLICAS", 1, "replicas of streams and buckets: 1, or 3 on a cluster")
	s.PositiveInt(&c.MaxAckPending, "max-ack-pending", "TINKERFLEET_MAX_ACK_PENDING", 1000, "fleet-wide cap on jobs in flight")
	s.NonZeroInt(&c.MaxDeliver, "max-deliver", "TINKERFLEET_MAX_DELIVER", 10, "deliveries a job is worked on before it is dead-lettered (the consumer keeps one more, for the dead letter); negative: no limit")
	s.PositiveDuration(&c.AckWait, "ack-wait", "TINKERFLEET_ACK_WAIT", 30*time.Second, "redelivery timeout of a job not heard from")
	s.PositiveDuration(&c.DuplicateWindow, "duplicate-window", "TINKERFLEET_DUPLICATE_WINDOW", 2*time.Hour,
		"how long job ids are remembered, so that a re-run submit publishes nothing twice (about 135 bytes of server memory per id)")
	s.PositiveDuration(&c.ResultsMaxAge, "results-max-age", "TINKERFLEET_RESULTS_MAX_AGE", 7*24*time.Hour, "how long results are kept")
}

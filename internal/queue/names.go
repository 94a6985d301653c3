package queue

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"regexp"
	"strings"
)

// DefaultPrefix is the subject prefix and name stem used when none is configured.
const DefaultPrefix = "tinkerfleet"

// ConsumerName is the durable pull consumer shared by every worker of a fleet.
const ConsumerName = "workers"

var (
	prefixPattern  = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	batchIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
)

// Names derives every stream, subject and bucket name of one deployment from its prefix.
type Names struct {
	// Prefix is the subject prefix, lower case, e.g. "tinkerfleet".
	Prefix string
}

// NewNames validates prefix (empty means DefaultPrefix) and returns the names it implies.
func NewNames(prefix string) (Names, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !prefixPattern.MatchString(prefix) {
		return Names{}, fmt.Errorf("queue prefix %q: must match %s", prefix, prefixPattern)
	}
	return Names{Prefix: prefix}, nil
}

func (n Names) stem() string { return strings.ToUpper(strings.ReplaceAll(n.Prefix, "-", "_")) }

// JobsStream is the name of the work-queue stream holding pending jobs.
func (n Names) JobsStream() string { return n.stem() + "_JOBS" }

// ResultsStream is the name of the stream holding one result per job.
func (n Names) ResultsStream() string { return n.stem() + "_RESULTS" }

// DeadStream is the name of the stream keeping the payloads of dead-lettered jobs.
func (n Names) DeadStream() string { return n.stem() + "_DEAD" }

// BatchesBucket is the KV bucket of batch manifests.
func (n Names) BatchesBucket() string { return strings.ReplaceAll(n.Prefix, "-", "_") + "_batches" }

// BackoffBucket is the KV bucket of the fleet-wide backoff state.
func (n Names) BackoffBucket() string { return strings.ReplaceAll(n.Prefix, "-", "_") + "_backoff" }

// JobSubject is the subject jobs of batch are published on.
func (n Names) JobSubject(batch string) string { return n.Prefix + ".jobs." + batch }

// ResultSubject is the subject of the one result of custom id customID in batch.
func (n Names) ResultSubject(batch, customID string) string {
	return n.Prefix + ".results." + batch + "." + JobToken(customID)
}

// ResultsFilter matches every result subject of batch.
func (n Names) ResultsFilter(batch string) string { return n.Prefix + ".results." + batch + ".*" }

// DeadSubject is the subject dead-lettered payloads of batch are kept on.
func (n Names) DeadSubject(batch string) string { return n.Prefix + ".dead." + batch }

// HeldSubject is the core NATS subject (no stream) on which workers answer AskHeld.
func (n Names) HeldSubject() string { return n.Prefix + ".held" }

// BatchFromJobSubject returns the batch id of a job subject, or "" if subject is not one. A
// wildcard is no batch id, though the jobs stream takes "<prefix>.jobs.*" and
// "<prefix>.jobs.>" from any client that publishes there: its job's result subject would be
// a wildcard too, and the look-up of its result would find a result of another batch (a
// job of batch "*" named "x", published again, was acked without a result for that of "x"
// in any batch).
func (n Names) BatchFromJobSubject(subject string) string {
	rest, ok := strings.CutPrefix(subject, n.Prefix+".jobs.")
	if !ok || rest == "*" || rest == ">" || strings.Contains(rest, ".") {
		return ""
	}
	return rest
}

// MsgID is the Nats-Msg-Id of a job: batch and custom id, so that publishing the same job
// twice is dropped by the jobs stream's duplicate window. (A result needs none: its stream
// keeps the first result on each job's subject and refuses any other.) A custom id that ends
// with a space is named by its JobToken after a "#", which no batch id holds: nats.go trims
// a header value's spaces, and "b/x " would have been "b/x", another job's, whose duplicate
// the stream dropped.
func MsgID(batch, customID string) string {
	if strings.HasSuffix(customID, " ") {
		return batch + "#" + JobToken(customID)
	}
	return batch + "/" + customID
}

// ValidateBatchID reports whether id can serve as a batch id: it becomes a subject token.
func ValidateBatchID(id string) error {
	if !batchIDPattern.MatchString(id) {
		return fmt.Errorf("batch id %q: must be 1-64 letters, digits, '_' or '-', starting with a letter or digit", id)
	}
	return nil
}

var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// JobToken is a subject-safe digest of a custom id (the first 120 bits of its SHA-256): the
// text of its JobKey.
func JobToken(customID string) string {
	key := JobKeyOf(customID)
	return tokenEncoding.EncodeToString(key[:])
}

// JobKey is the digest JobToken writes, as bytes: a set of a batch's jobs keyed by it takes 15
// bytes a job, against a token's 24 and its string header (and, for a token cut from a
// result's subject, the whole subject it keeps alive).
type JobKey [15]byte

// JobKeyOf is the JobKey of custom id customID.
func JobKeyOf(customID string) JobKey {
	sum := sha256.Sum256([]byte(customID))
	return JobKey(sum[:15])
}

// ParseJobToken reads the JobKey that token (a JobToken) writes, and reports false for
// anything else.
func ParseJobToken(token string) (JobKey, bool) {
	var key JobKey
	if tokenEncoding.EncodedLen(len(key)) != len(token) {
		return key, false
	}
	n, err := tokenEncoding.Decode(key[:], []byte(token))
	return key, err == nil && n == len(key)
}

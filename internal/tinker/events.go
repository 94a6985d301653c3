package tinker

import "time"

// EventKind says what an [Event] reports.
type EventKind int

// The kinds of events delivered to Config.OnEvent.
const (
	// EventRequest: one HTTP request finished (Endpoint, Method, StatusCode or 0 on
	// a connection error, Duration, Attempt = x-stainless-retry-count). A bare 400 (§1.4),
	// which is retried as a connection error, reports its 400.
	EventRequest EventKind = iota + 1
	// EventRateLimited: a 429 was seen (Endpoint; on asample Delay is the dispatch
	// backoff of §5.3, on retrieve_future the poll sleep of §4.2).
	EventRateLimited
	// EventBillingPaused: a 402 was seen inside the billing window (§2.3); Delay is
	// the pause taken.
	EventBillingPaused
	// EventQueueState: a poll reported a queue state (§4.3); QueueState, Reason
	// (the server's or the default text) and SamplerID are set.
	EventQueueState
	// EventRetry: a retry layer is about to sleep Delay and retry (Layer, Attempt,
	// Err).
	EventRetry
	// EventHeartbeatFailed: a session heartbeat failed (Err); the client keeps going.
	EventHeartbeatFailed
)

// String returns a short name for the kind, suitable as a metric label.
func (k EventKind) String() string {
	switch k {
	case EventRequest:
		return "request"
	case EventRateLimited:
		return "rate_limited"
	case EventBillingPaused:
		return "billing_paused"
	case EventQueueState:
		return "queue_state"
	case EventRetry:
		return "retry"
	case EventHeartbeatFailed:
		return "heartbeat_failed"
	}
	return "unknown"
}

// RetryLayer names one of the retry layers of §6 (plus the poll loop of §4.2).
type RetryLayer string

// The retry layers.
const (
	LayerHTTP   RetryLayer = "http"   // §6.1, per HTTP call
	LayerSubmit RetryLayer = "submit" // §6.2, the 300 s execute_with_retries loop
	LayerSample RetryLayer = "sample" // §6.3, whole sample attempt with a new seq_id
	LayerPoll   RetryLayer = "poll"   // §4.2, a poll again after a 429, a 5xx, a 400 with a body or a connection error
)

// QueueState is the server's queue state reported by try_again replies (§4.3).
type QueueState string

// Queue states; anything the client does not know is QueueUnknown.
const (
	QueueActive          QueueState = "active"
	QueuePausedCapacity  QueueState = "paused_capacity"
	QueuePausedRateLimit QueueState = "paused_rate_limit"
	QueueUnknown         QueueState = "unknown"
)

// Paused reports whether the state is other than active: the SDK logs a sampler in any such
// state, QueueUnknown included, as paused (§4.3).
func (q QueueState) Paused() bool { return q != QueueActive }

// Holding reports whether the state is one in which the service is known to hold samples
// back: paused_capacity or paused_rate_limit (§4.3). QueueUnknown is not: a state the client
// does not know may be a normal one, and a service that is full still answers 429.
func (q QueueState) Holding() bool { return q == QueuePausedCapacity || q == QueuePausedRateLimit }

func parseQueueState(s string) QueueState {
	switch QueueState(s) {
	case QueueActive, QueuePausedCapacity, QueuePausedRateLimit:
		return QueueState(s)
	}
	return QueueUnknown
}

// defaultQueueReason is the text the SDK logs when the server gave none (§4.3).
func defaultQueueReason(q QueueState) string {
	switch q {
	case QueuePausedRateLimit:
		return "concurrent sampler weights limit hit"
	case QueuePausedCapacity:
		return "Tinker backend is running short on capacity, please wait"
	}
	return "unknown"
}

// Event is an observable occurrence inside the client, delivered synchronously to
// Config.OnEvent. Fields not relevant to the Kind are zero. Events never carry the
// API key or a JWT.
type Event struct {
	Kind       EventKind
	Endpoint   string        // endpoint name, e.g. "asample", "retrieve_future", "samplers"
	Method     string        // HTTP method (EventRequest)
	StatusCode int           // HTTP status, 0 for a connection error (EventRetry: also from Err)
	Duration   time.Duration // request duration (EventRequest)
	QueueState QueueState    // EventQueueState
	Reason     string        // queue-state reason or backoff reason
	SamplerID  string        // sampling session id, when known
	Layer      RetryLayer    // EventRetry
	Delay      time.Duration // sleep about to be taken
	Attempt    int           // retry number within its layer (0-based) or HTTP retry count
	Err        error         // the error that caused a retry or failure
}

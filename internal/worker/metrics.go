package worker

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tinkerfleet/tinkerfleet/internal/dispatch"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
)

// Metrics are a worker's Prometheus measurements. A nil *Metrics records nothing.
type Metrics struct {
	reg              prometheus.Registerer
	jobsPulled       prometheus.Counter
	fetches          *prometheus.CounterVec
	jobsFinished     *prometheus.CounterVec
	jobLatency       prometheus.Histogram
	deadLetters      prometheus.Counter
	redeliveriesHeld prometheus.Counter
	leftUnsent       prometheus.Counter
	panics           prometheus.Counter
	promptTokens     prometheus.Counter
	completionTokens prometheus.Counter
	requests         *prometheus.CounterVec
	requestLatency   *prometheus.HistogramVec
	rateLimited      *prometheus.CounterVec
	billingPaused    prometheus.Counter
	retries          *prometheus.CounterVec
	queueState       *prometheus.GaugeVec
	backoffSignals   *prometheus.CounterVec
	limitsForgotten  *prometheus.CounterVec

	// The series of the hot paths, by their label values (see seriesCache).
	requestSeries  seriesCache[requestKey, requestSeries]
	finishedSeries seriesCache[finishedKey, prometheus.Counter]
}

// requestKey and requestSeries are the labels and series of one endpoint's replies of one status.
type requestKey struct {
	endpoint string
	status   int
}

type requestSeries struct {
	count   prometheus.Counter
	latency prometheus.Observer
}

// finishedKey is the labels of a finished job's series.
type finishedKey struct{ status, code string }

// seriesCache keeps the labelled series of a vector by their label values, so that a path taken
// for every request or job finds them in a map rather than through WithLabelValues, which
// hashes and checks every label value each time: about 3,000 instructions a sample
// (bench -instructions). It holds as many series as the vector does.
type seriesCache[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

// get returns the series of k, made by create the first time.
func (c *seriesCache[K, V]) get(k K, create func() V) V {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = create()
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[K]V)
	}
	c.m[k] = v
	c.mu.Unlock()
	return v
}

// NewMetrics creates the worker's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reg: reg,
		jobsPulled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tinkerfleet_jobs_pulled_total", Help: "Job deliveries pulled from the jobs stream.",
		}),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tinkerfleet_fetches_total",
			Help: "Pull requests for jobs, by outcome: jobs (at least one came), empty (expired with none), error.",
		}, []string{"outcome"}),
		jobsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tinkerfleet_jobs_finished_total", Help: "Jobs that ended with a published result, by status and error code.",
		}, []string{"status", "code"}),
		jobLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tinkerfleet_job_duration_seconds",
			Help:    "Time from pulling a job to its result, for jobs that ended.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 20), // 10 ms to 87 min: past the 30 min --sample-timeout, with a try again
		}),
		deadLetters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tinkerfleet_dead_letters_total", Help: "Jobs that ran out of deliveries, counted as their dead-letter result is stored.",
		}),
		redeliveriesHeld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tinkerfleet_redeliveries_held_total",
			Help: "Jobs delivered again while this worker still held them (its InProgress came later than the ack wait: a frozen process, or a NATS link down); left to the delivery held, not sampled twice.",
		}),
		leftUnsent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tinkerfleet_jobs_left_unsent_total",
			Help: "Jobs not sent to Tinker because the NATS server had not heard of them from this worker for about the ack wait (a NATS link down, a frozen process): it may have given them to another worker; left to it, not sampled twice.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tinkerfleet_job_panics_total",
			Help: "Jobs whose work panicked (a tinkerfleet bug): each ended with an internal error result, and the worker logged the stack.",
		}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tinkerfleet_prompt_tokens_total", Help: "Prompt tokens of successful jobs.",
		}),
		completionTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tinkerfleet_completion_tokens_total", Help: "Completion tokens of successful jobs.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tinkerfleet_tinker_requests_total", Help: "Tinker HTTP requests by endpoint and status (0: no response).",
		}, []string{"endpoint", "status"}),
		requestLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tinkerfleet_tinker_request_duration_seconds",
			Help:    "Tinker HTTP request durations by endpoint (polls include the server's long-poll wait).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"endpoint"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tinkerfleet_tinker_rate_limited_total", Help: "429 replies by endpoint.",
		}, []string{"endpoint"}),
		billingPaused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tinkerfleet_tinker_billing_paused_total", Help: "402 replies inside the billing window.",
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tinkerfleet_tinker_retries_total", Help: "Retries by layer (http, submit, sample, poll).",
		}, []string{"layer"}),
		queueState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tinkerfleet_sampler_queue_state", Help: "Samplers by queue state: the one a poll last reported, or active once the sampler completed a sample since.",
		}, []string{"state"}),
		backoffSignals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tinkerfleet_backoff_signals_total", Help: "Backoff signals sent by this worker, by reason (429, 402, paused queue states).",
		}, []string{"reason"}),
		limitsForgotten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tinkerfleet_capacity_limits_forgotten_total",
			Help: "Capacity limits this worker dropped because another worker that held a part of the capacity stopped (reason left) or went silent (silent: it crashed, or lost NATS for 15 s); the next 429 learns the capacity anew.",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.backoffSignals, m.limitsForgotten, m.jobsPulled, m.fetches, m.jobsFinished, m.jobLatency, m.deadLetters, m.redeliveriesHeld, m.leftUnsent, m.panics, m.promptTokens,
		m.completionTokens, m.requests, m.requestLatency, m.rateLimited, m.billingPaused, m.retries, m.queueState)
	return m
}

// watch registers gauges read on scrape from the limiter (less pulling, the count permits
// the puller holds for jobs not pulled yet), the backoff, the capacity, the count of results
// held for another try, the memory results take and the NATS connection. It returns what
// stops the count of the connection's reconnects, for the worker's Close.
func (m *Metrics) watch(l *dispatch.Limiter, pulling *atomic.Int64, b Backoff, c *capacity, held *atomic.Int64, mem *resultMemory, nc *nats.Conn) (stop func()) {
	if m == nil {
		return func() {}
	}
	// nats.go's Stats().Reconnects counts every try that reached a server, those the server
	// refused included (its credentials, TLS): a server that refused a rotated password
	// counted three a second, for one drop, and the alert on a connection that keeps dropping
	// fired. A status listener counts the times the connection was made again.
	reconnects := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tinkerfleet_nats_reconnects_total", Help: "Times the worker's NATS connection was made again after a drop (a server restart, a link that died); tries the server refused do not count.",
	})
	back := nc.StatusChanged(nats.CONNECTED)
	go func() { // ends when stop removes the listener, which closes back
		for range back {
			reconnects.Inc()
		}
	}()
	stop = func() { nc.RemoveStatusListener(back) }
	gauge := func(name, help string, f func(dispatch.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(l.Stats()) })
	}
	m.reg.MustRegister(
		// Not those the puller holds for its next pull request: an idle worker holds up to
		// 64, and read as in use they showed a worker of 64 job slots or fewer full when idle.
		gauge("tinkerfleet_dispatch_count_in_use", "Count permits held by jobs (from their pull to their sample's acceptance).",
			func(s dispatch.Stats) float64 { return float64(max(s.CountInUse-int(pulling.Load()), 0)) }),
		gauge("tinkerfleet_dispatch_throttled_in_use", "Throttled permits held.",
			func(s dispatch.Stats) float64 { return float64(s.ThrottledInUse) }),
		gauge("tinkerfleet_dispatch_bytes_charged", "Bytes charged against the dispatch budget.",
			func(s dispatch.Stats) float64 { return float64(s.BytesCharged) }),
		gauge("tinkerfleet_dispatch_bytes_in_flight", "Estimated prompt bytes being dispatched.",
			func(s dispatch.Stats) float64 { return float64(s.BytesEstimated) }),
		gauge("tinkerfleet_dispatch_waiting", "Callers waiting on any dispatch layer.",
			func(s dispatch.Stats) float64 { return float64(s.CountWaiting + s.ThrottledWaiting + s.BytesWaiting) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tinkerfleet_capacity_limit", Help: "Samples in flight this worker allows itself, its part of the capacity the fleet learned from 429s (0: no limit).",
		}, func() float64 { return float64(c.current()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tinkerfleet_samples_in_flight", Help: "Samples of this worker at the Tinker service: asample on the wire, or accepted and its result not back yet.",
		}, func() float64 { return float64(c.atService()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tinkerfleet_results_held",
			Help: "Results sampled but not stored yet because the results stream could not store anything; their jobs wait, and are not sampled again.",
		}, func() float64 { return float64(held.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tinkerfleet_result_memory_bytes",
			Help: "Memory charged to results between their arrival and their storage (an estimate); no new sample is sent while it reaches --result-memory.",
		}, func() float64 { return float64(mem.charged()) }),
		reconnects,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tinkerfleet_backoff_active", Help: "1 while the backoff deadline is in the future.",
		}, func() float64 {
			if time.Now().Before(b.Until()) {
				return 1
			}
			return 0
		}),
	)
	// The program may serve this gauge already, from before the worker was open (cmd/worker:
	// from start-up, on the same connection): that one goes on.
	connected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tinkerfleet_nats_connected", Help: NATSConnectedHelp},
		func() float64 {
			if nc.IsConnected() {
				return 1
			}
			return 0
		})
	if err := m.reg.Register(connected); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		panic(err)
	}
	return stop
}

// NATSConnectedHelp is the help of tinkerfleet_nats_connected, which a program may register
// before its worker is open (see watch).
const NATSConnectedHelp = "1 while the worker's NATS connection is up; 0 while it is being made again."

// event counts a Tinker client event.
func (m *Metrics) event(e tinker.Event) {
	if m == nil {
		return
	}
	switch e.Kind {
	case tinker.EventRequest:
		s := m.requestSeries.get(requestKey{e.Endpoint, e.StatusCode}, func() requestSeries {
			return requestSeries{
				count:   m.requests.WithLabelValues(e.Endpoint, strconv.Itoa(e.StatusCode)),
				latency: m.requestLatency.WithLabelValues(e.Endpoint),
			}
		})
		s.count.Inc()
		s.latency.Observe(e.Duration.Seconds())
	case tinker.EventRateLimited:
		m.rateLimited.WithLabelValues(e.Endpoint).Inc()
	case tinker.EventBillingPaused:
		m.billingPaused.Inc()
	case tinker.EventRetry:
		m.retries.WithLabelValues(string(e.Layer)).Inc()
	}
}

func (m *Metrics) signal(reason string) {
	if m != nil {
		m.backoffSignals.WithLabelValues(reason).Inc()
	}
}

// fetched counts one pull request by its outcome.
func (m *Metrics) fetched(outcome string) {
	if m != nil {
		m.fetches.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) pulled() {
	if m != nil {
		m.jobsPulled.Inc()
	}
}

func (m *Metrics) redeliveredHeld() {
	if m != nil {
		m.redeliveriesHeld.Inc()
	}
}

func (m *Metrics) leftToFleet() {
	if m != nil {
		m.leftUnsent.Inc()
	}
}

// forgotLimit counts a limit dropped for reason (left, silent).
func (m *Metrics) forgotLimit(reason string) {
	if m != nil {
		m.limitsForgotten.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) panicked() {
	if m != nil {
		m.panics.Inc()
	}
}

// finished counts a job that ended with res, a result this worker stored (one another
// worker stored first is not counted here: see settled), dead letters among them.
func (m *Metrics) finished(res *jobs.Result, took time.Duration) {
	if m == nil {
		return
	}
	code := ""
	if res.Error != nil {
		code = res.Error.Code
	}
	if code == jobs.CodeDeadLetter {
		m.deadLetters.Inc()
	}
	k := finishedKey{string(res.Status), code}
	m.finishedSeries.get(k, func() prometheus.Counter { return m.jobsFinished.WithLabelValues(k.status, k.code) }).Inc()
	if took > 0 {
		m.jobLatency.Observe(took.Seconds())
	}
	if res.Usage != nil {
		m.promptTokens.Add(float64(res.Usage.PromptTokens))
		m.completionTokens.Add(float64(res.Usage.CompletionTokens))
	}
}

package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Header names set on tinkerfleet messages.
const (
	// HeaderContentEncoding marks a compressed payload; the only value used is "zstd".
	HeaderContentEncoding = "Content-Encoding"
	// HeaderStatus carries a result's status (ok, error, cancelled), so that counting results
	// needs no payload.
	HeaderStatus = "Tinkerfleet-Status"
	// HeaderCustomID carries the custom id of a job or result (read it with CustomID).
	HeaderCustomID = "Tinkerfleet-Custom-Id"
	// HeaderCustomIDBracketed says that HeaderCustomID holds its custom id between brackets:
	// nats.go trims the spaces around a header value, and a custom id may begin or end with
	// spaces (see setCustomID).
	HeaderCustomIDBracketed = "Tinkerfleet-Custom-Id-Bracketed"
	// HeaderDeadReason says why a payload was dead-lettered.
	HeaderDeadReason = "Tinkerfleet-Dead-Reason"
	// HeaderTokens carries an ok result's token counts (Tokens), so that totals need no
	// payload either.
	HeaderTokens = "Tinkerfleet-Tokens"
	// HeaderRepublished marks a job published again by a resumed submit: it may already have
	// a result, so the worker looks before sampling (first deliveries are otherwise not checked).
	HeaderRepublished = "Tinkerfleet-Republished"
)

// Tokens counts the tokens of a result: the prompt's, those of the prompt billed as prefix
// cache hits, and the samples'. Its JSON is that of a result line's usage.
type Tokens struct {
	Prompt     int `json:"prompt_tokens"`
	Completion int `json:"completion_tokens"`
	CacheHit   int `json:"cache_hit_tokens"`
}

// Add adds o to t.
func (t *Tokens) Add(o Tokens) {
	t.Prompt, t.Completion, t.CacheHit = t.Prompt+o.Prompt, t.Completion+o.Completion, t.CacheHit+o.CacheHit
}

// headerValue is t as HeaderTokens holds it: the three counts in decimal, space-separated,
// in the order of the fields.
func (t Tokens) headerValue() string {
	b := make([]byte, 0, 24)
	b = strconv.AppendInt(b, int64(t.Prompt), 10)
	b = strconv.AppendInt(append(b, ' '), int64(t.Completion), 10)
	b = strconv.AppendInt(append(b, ' '), int64(t.CacheHit), 10)
	return string(b)
}

// ResultTokens reads the HeaderTokens of a result's headers: zero for a result without it (an
// error, or a worker of an earlier version) or with a value it cannot read.
func ResultTokens(h nats.Header) Tokens {
	fields := strings.SplitN(h.Get(HeaderTokens), " ", 4)
	if len(fields) != 3 {
		return Tokens{}
	}
	var t Tokens
	for i, n := range []*int{&t.Prompt, &t.Completion, &t.CacheHit} {
		c, err := strconv.Atoi(fields[i])
		if err != nil || c < 0 {
			return Tokens{}
		}
		*n = c
	}
	return t
}

// DefaultCompressThreshold is the payload size above which results are zstd-compressed.
const DefaultCompressThreshold = 64 << 10

// MaxResultBytes is the largest payload, decompressed, that Codec.Decode takes, and so the
// largest result ResultMsg makes a message of. It bounds a reader's memory for one result: a
// message of a few kilobytes may declare, or hold, hundreds of megabytes of zstd, and a
// result's JSON compresses that far (16 samples of 32,768 of Qwen3's longest token, 128
// spaces, with OpenAI logprobs: 266 MiB of JSON in 37 KiB). Results of jobs within the
// default limits stay under it unless most of their tokens are such runs.
const MaxResultBytes = 256 << 20

// ErrTooLarge is returned when a payload does not fit the server's max payload even
// compressed, or is over MaxResultBytes.
var ErrTooLarge = errors.New("payload too large to store")

// Codec compresses large payloads. It is safe for concurrent use.
type Codec struct {
	threshold  int
	maxDecoded int // MaxResultBytes; tests make it smaller
	enc        *zstd.Encoder
	decOnce    sync.Once
	dec        *zstd.Decoder
	decErr     error
}

// NewCodec returns a codec that compresses payloads larger than threshold bytes (0 means
// DefaultCompressThreshold).
func NewCodec(threshold int) (*Codec, error) {
	if threshold <= 0 {
		threshold = DefaultCompressThreshold
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	return &Codec{threshold: threshold, maxDecoded: MaxResultBytes, enc: enc}, nil
}

// encode fills msg with data on subject, compressed with a Content-Encoding header when data
// is over the threshold. The rest of msg's header map is kept.
func (c *Codec) encode(msg *nats.Msg, subject string, data []byte) {
	msg.Subject = subject
	if len(data) > c.threshold {
		setHeader(msg.Header, HeaderContentEncoding, "zstd")
		data = c.enc.EncodeAll(data, make([]byte, 0, len(data)/4))
	} else {
		delete(msg.Header, HeaderContentEncoding) // a reused message may have held a large one
	}
	msg.Data = data
}

// setHeader is Header.Set that reuses the entry's slice: a worker fills the same result
// message for every job it settles.
func setHeader(h nats.Header, key, value string) { h[key] = append(h[key][:0], value) }

// setCustomID puts customID in h. nats.go trims the spaces around a header value
// (textproto.TrimString, on sending and on reading), so a custom id that begins or ends with
// one goes between brackets, and HeaderCustomIDBracketed says so: "x " and "x" are two jobs,
// and " y" would have reached its worker as "y", which took the job for not the message's.
func setCustomID(h nats.Header, customID string) {
	if customID != "" && (customID[0] == ' ' || customID[len(customID)-1] == ' ') {
		setHeader(h, HeaderCustomID, "["+customID+"]")
		setHeader(h, HeaderCustomIDBracketed, "1")
		return
	}
	setHeader(h, HeaderCustomID, customID)
	delete(h, HeaderCustomIDBracketed) // a header map reused for another message
}

// CustomID is the custom id a job or result message's header h carries.
func CustomID(h nats.Header) string {
	id := h.Get(HeaderCustomID)
	if len(id) >= 2 && h.Get(HeaderCustomIDBracketed) != "" {
		return id[1 : len(id)-1]
	}
	return id
}

// Decode returns the payload of a message, decompressing it when its header says so.
func (c *Codec) Decode(header nats.Header, data []byte) ([]byte, error) {
	switch enc := header.Get(HeaderContentEncoding); enc {
	case "":
		return data, nil
	case "zstd":
		c.decOnce.Do(func() {
			c.dec, c.decErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(uint64(c.maxDecoded)))
		})
		if c.decErr != nil {
			return nil, fmt.Errorf("zstd decoder: %w", c.decErr)
		}
		out, err := c.dec.DecodeAll(data, nil)
		if err != nil {
			return nil, fmt.Errorf("decompress payload: %w", err)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("unknown content encoding %q", enc)
	}
}

// Close releases the codec's encoder and decoder.
func (c *Codec) Close() {
	c.enc.Close()
	if c.dec != nil {
		c.dec.Close()
	}
}

// ResultMsg fills msg with the message that stores the result of customID in batch and
// returns it: data compressed when over the codec's threshold, status and custom id in
// headers, on the job's own result subject, where the stream keeps the first result stored
// and refuses any other (see ResultStored). A nil msg means a new one; a msg given back keeps
// its header map, so a worker can reuse one message for job after job once the stream has
// acked it. tokens, unless zero, go in HeaderTokens. It returns ErrTooLarge when the message
// does not fit maxPayload (0: no limit), or data is over MaxResultBytes, which no reader would
// decode. The message holds data itself, not a copy.
func (q *Queue) ResultMsg(msg *nats.Msg, codec *Codec, batch, customID, status string, tokens Tokens, data []byte, maxPayload int64) (*nats.Msg, error) {
	if msg == nil {
		msg = &nats.Msg{}
	}
	if len(data) > codec.maxDecoded {
		// Stored, it would stop every reader of the batch's results there (Decode).
		return nil, fmt.Errorf("result of %s/%s: %d bytes, over the %d a reader decodes: %w", batch, customID, len(data), codec.maxDecoded, ErrTooLarge)
	}
	if msg.Header == nil {
		msg.Header = make(nats.Header, 4)
	}
	codec.encode(msg, q.Names.ResultSubject(batch, customID), data)
	setHeader(msg.Header, HeaderStatus, status)
	setCustomID(msg.Header, customID)
	if tokens == (Tokens{}) {
		delete(msg.Header, HeaderTokens)
	} else {
		setHeader(msg.Header, HeaderTokens, tokens.headerValue())
	}
	if maxPayload > 0 && int64(len(msg.Data)+headerSize(msg.Header)) > maxPayload {
		return nil, fmt.Errorf("result of %s/%s: %d bytes: %w", batch, customID, len(msg.Data), ErrTooLarge)
	}
	return msg, nil
}

// PublishResult stores one result message (made by ResultMsg) and waits for the stream's ack,
// so the caller may ack the job afterwards (invariant 2). A worker stores its results in
// groups with a ResultPublisher; this is for the odd one outside them. first is false when
// the job had a result already, which stays (ResultStored): then err is nil too, and the
// caller should not count the job as ended by it.
func (q *Queue) PublishResult(ctx context.Context, msg *nats.Msg) (first bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, ResultAckTimeout)
	defer cancel()
	if _, err := q.JS.PublishMsg(ctx, msg); err != nil {
		if ResultStored(err) {
			return false, nil
		}
		return false, fmt.Errorf("publish result of %s: %w", CustomID(msg.Header), err)
	}
	return true, nil
}

// errCodeStoreFailed is the JetStream API error code of a message the stream did not store
// (JSStreamStoreFailedF); its description says why.
const errCodeStoreFailed = 10077

// ResultStored reports whether err is the results stream refusing a result because the job
// already has one (a worker that raced another on the same job, a dead letter for a job
// whose result came in): the result that counts is stored, and the job may be settled.
func ResultStored(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStoreFailed &&
		strings.Contains(apiErr.Description, "maximum messages per subject exceeded")
}

// ResultAckTimeout is how long PublishResult and a ResultPublisher wait for the results
// stream's acks: the default timeout of a JetStream request.
const ResultAckTimeout = 5 * time.Second

// HasResult reports whether a result of customID in batch is already stored, so that a job
// delivered again after its result was published (a crash between publish and ack) is acked
// without sampling twice.
func (q *Queue) HasResult(ctx context.Context, batch, customID string) (bool, error) {
	_, err := q.Results.GetLastMsgForSubject(ctx, q.Names.ResultSubject(batch, customID))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("look up result of %s/%s: %w", batch, customID, err)
	}
}

// ResultsStored counts the results stored for batch (one per job that has one). The server
// counts them, as the pending messages of a short-lived consumer on the batch's result
// subjects: no result is sent (about 8 ms for a batch of 50,000 on an embedded server).
func (q *Queue) ResultsStored(ctx context.Context, batch string) (int, error) {
	cons, err := q.Results.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     q.Names.ResultsFilter(batch),
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute, // removed by the server if the delete below is lost
	})
	if err != nil {
		return 0, fmt.Errorf("count results of %s: %w", batch, err)
	}
	info := cons.CachedInfo()
	if err := q.Results.DeleteConsumer(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, fmt.Errorf("count results of %s: remove counting consumer: %w", batch, err)
	}
	return int(info.NumPending), nil
}

// ReadResults returns an iterator over the results stored for batch, oldest first, through an
// ordered consumer (which takes up again where it was after a gap or a reconnect); with
// headersOnly, without their payloads. Stop it when done.
//
// Read it with Next, not with Fetch in a loop: nats.go replaces an ordered consumer on the
// server for each Fetch, and the server counts each new one's pending results over the
// batch's subjects, so reading a batch in fetches of 1024 took time quadratic in its size
// (status of 1,000,000 results: 60-63 s, against 6.3-8.1 s with the iterator).
func (q *Queue) ReadResults(ctx context.Context, batch string, headersOnly bool) (jetstream.MessagesContext, error) {
	cons, err := q.JS.OrderedConsumer(ctx, q.Names.ResultsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{q.Names.ResultsFilter(batch)},
		HeadersOnly:    headersOnly,
	})
	if err != nil {
		return nil, fmt.Errorf("read results of %s: %w", batch, err)
	}
	var ahead jetstream.PullMessagesOpt = jetstream.PullMaxMessages(readAhead)
	if !headersOnly {
		// Results may be as large as the max payload each: readAhead of them could be
		// gigabytes waiting in memory for a reader that writes slower than the server sends.
		// With a byte limit alone nats.go buffers up to a million messages (a channel of 8 MB).
		ahead = jetstream.PullMaxMessagesWithBytesLimit(readAhead, max(readAheadBytes, 2*int(q.JS.Conn().MaxPayload())))
	}
	it, err := cons.Messages(ahead)
	if err != nil {
		return nil, fmt.Errorf("read results of %s: %w", batch, err)
	}
	return it, nil
}

// readAhead is how many results ReadResults asks the server for ahead of those read, when
// it reads their headers only.
const readAhead = 1024

// readAheadBytes is how many bytes of results, at most, ReadResults asks the server for ahead
// of those read when it reads their payloads too (twice the server's max payload, if more).
const readAheadBytes = 32 << 20

// PublishJobAsync publishes one job without waiting for its ack; the returned future settles
// when the stream has stored it or found it a duplicate. republished says the batch was
// published before (a resumed submit), so the job may already have a result.
func (q *Queue) PublishJobAsync(batch, customID string, data []byte, republished bool) (jetstream.PubAckFuture, error) {
	msg := nats.NewMsg(q.Names.JobSubject(batch))
	setCustomID(msg.Header, customID)
	if republished {
		msg.Header.Set(HeaderRepublished, "1")
	}
	msg.Data = data
	f, err := q.JS.PublishMsgAsync(msg, jetstream.WithMsgID(MsgID(batch, customID)))
	if err != nil {
		return nil, fmt.Errorf("publish job %s/%s: %w", batch, customID, err)
	}
	return f, nil
}

// JobHeaderRoom is the most the headers of a job message, and of its dead-letter copy, take
// of the server's max payload: a Nats-Msg-Id of a batch id (up to 64 bytes) and a custom_id
// (up to 256), the custom_id again (bracketed, with its mark, if spaces begin or end it), the
// republished mark or the dead reason (maxDeadReason), and the header block's framing. A job
// whose payload fits the max payload less this room is stored, and so is its copy if it is
// dead-lettered.
const JobHeaderRoom = 1024

// maxDeadReason bounds the reason a dead-letter copy carries, in bytes, so that the copy fits
// JobHeaderRoom; the job's result carries the whole error.
const maxDeadReason = 256

// PublishDead keeps the payload of a job that ran out of deliveries, with the reason (cut to
// maxDeadReason bytes).
func (q *Queue) PublishDead(ctx context.Context, batch, customID, reason string, data []byte) error {
	msg := nats.NewMsg(q.Names.DeadSubject(batch))
	setCustomID(msg.Header, customID)
	msg.Header.Set(HeaderDeadReason, clip(reason, maxDeadReason))
	msg.Data = data
	if _, err := q.JS.PublishMsg(ctx, msg, jetstream.WithMsgID("dead/"+MsgID(batch, customID))); err != nil {
		return fmt.Errorf("publish dead letter %s/%s: %w", batch, customID, err)
	}
	return nil
}

func headerSize(h nats.Header) int {
	n := 12 // "NATS/1.0\r\n" and the final "\r\n"
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendOpenAIFromJSON appends the OpenAI Batch output line (AppendOpenAI) of data, a stored
// result line (AppendJSON's output), and returns its custom_id and batch_id: the bytes and
// errors of DecodeResult(data) then AppendOpenAI(b, created), at a memory cost a small part of
// theirs. DecodeResult holds every number of every sample at once, through encoding/json's
// per-value allocations: for 16 samples of 32,768 tokens with OpenAI logprobs the two
// allocated 11 to 14 times the stored size besides the line they wrote, and held 3.5 times it
// at once; GiBs for a result of queue.MaxResultBytes. This reads the line in place,
// checking first everything DecodeResult checks, then decodes each sample only when its choice
// is written, into one reused Sample; what it allocates beyond the line it returns is a few
// times the largest sample (cmd/submit's TestOpenAIResultLineMemoryIsBounded), and what it
// holds at once about one sample.
//
// A line that is not as AppendJSON writes its members (a member written twice, a key that
// only encoding/json's case folding matches, null or another type where AppendJSON writes a
// value, a number encoding/json would refuse, anything after the line but white space) is
// left to DecodeResult, so that it is read, or refused with the same error, as before.
func AppendOpenAIFromJSON(b, data []byte, created time.Time) (out []byte, customID, batchID string, err error) {
	sc, ok := scanStoredResult(data)
	if !ok {
		r, err := DecodeResult(data)
		if err != nil {
			return nil, "", "", err
		}
		out, err = r.AppendOpenAI(b, created)
		return out, r.CustomID, r.BatchID, err
	}
	r := &sc.head
	if err := r.Validate(); err != nil { // r.Samples is nil: the samples are checked below
		return nil, "", "", fmt.Errorf("decode result: %w", err)
	}
	// The samples are read again for each use rather than kept: a list of many small samples
	// would take several times its JSON (scanSamples checked them).
	for i, it := 0, newArrIter(sc.samples); i < sc.n; i++ {
		v, _ := it.next()
		raw, _ := scanSample(v)
		if err := raw.validate(i); err != nil {
			return nil, "", "", fmt.Errorf("decode result: %w", err)
		}
	}
	var s Sample
	it := newArrIter(sc.samples)
	sample := func(int) *Sample { // called for each sample in turn
		v, _ := it.next()
		raw, _ := scanSample(v)
		raw.decode(&s)
		return &s
	}
	return r.appendOpenAI(b, created, sc.n, sample), r.CustomID, r.BatchID, nil
}

// storedResult is a stored result line read in place by scanStoredResult.
type storedResult struct {
	head    Result // every member but the samples (and the prompt logprobs, not written)
	samples []byte // the list of samples as written in the line, "[]" when absent
	n       int    // samples
}

// rawSample is a sample of a stored result line, its lists still as written.
type rawSample struct {
	text, tokens, logprobs, tokenBytes []byte // raw values; nil when absent
	stopReason                         string
	nTokens, nLogprobs, nTokenBytes    int // elements; -1 for a null or absent list
}

// validate checks sample i as Validate does: null or absent tokens are no tokens (len(nil)),
// which an empty list of logprobs or token bytes matches.
func (s *rawSample) validate(i int) error {
	return validateSample(i, s.stopReason, max(s.nTokens, 0), s.nLogprobs, s.nTokenBytes)
}

// decode fills d with the sample, reusing d's lists; the lists were checked by scanSample.
func (s *rawSample) decode(d *Sample) {
	d.Text, d.StopReason = "", s.stopReason
	if s.text != nil {
		d.Text, _ = storedString(s.text)
	}
	d.Tokens = d.Tokens[:0]
	if s.nTokens < 0 {
		d.Tokens = nil
	} else {
		if d.Tokens == nil || cap(d.Tokens) < s.nTokens {
			d.Tokens = make([]int, 0, s.nTokens)
		}
		it := newArrIter(s.tokens)
		for v, ok := it.next(); ok; v, ok = it.next() {
			n, _ := storedInt(v)
			d.Tokens = append(d.Tokens, int(n))
		}
	}
	if s.nLogprobs < 0 {
		d.Logprobs = nil
	} else {
		d.Logprobs = decodeLogprobs(d.Logprobs[:0], s.logprobs, s.nLogprobs)
	}
	if s.nTokenBytes < 0 {
		d.TokenBytes = nil
		return
	}
	d.TokenBytes = decodeTokenBytes(d.TokenBytes[:0], s.tokenBytes, s.nTokenBytes)
}

// decodeLogprobs decodes raw, a list of n numbers and nulls that scanLogprobs checked, into
// lp (reusing its array when it holds n).
func decodeLogprobs(lp Logprobs, raw []byte, n int) Logprobs {
	if lp == nil || cap(lp) < n {
		lp = make(Logprobs, 0, n)
	}
	it := newArrIter(raw)
	for v, ok := it.next(); ok; v, ok = it.next() {
		f, _ := storedLogprob(v)
		lp = append(lp, f)
	}
	return lp
}

// decodeTokenBytes decodes raw, a list of n lists of bytes that scanSample checked, into tb
// (reusing its array): one buffer holds the bytes of every token, as TokenBytes.UnmarshalJSON
// makes them.
func decodeTokenBytes(tb TokenBytes, raw []byte, n int) TokenBytes {
	total := 0
	it := newArrIter(raw)
	for v, ok := it.next(); ok; v, ok = it.next() {
		total += arrayLen(v)
	}
	buf := make([]byte, 0, total)
	if tb == nil || cap(tb) < n {
		tb = make(TokenBytes, 0, n)
	}
	it = newArrIter(raw)
	for v, ok := it.next(); ok; v, ok = it.next() {
		start := len(buf)
		bi := newArrIter(v)
		for c, ok := bi.next(); ok; c, ok = bi.next() {
			n, _ := storedInt(c)
			buf = append(buf, byte(n))
		}
		tb = append(tb, buf[start:len(buf):len(buf)])
	}
	return tb
}

// Members of a stored result line, as bits of a set (to find one written twice).
const (
	memCustomID = 1 << iota
	memBatchID
	memStatus
	memModel
	memFormat
	memOpenAILogprobs
	memSamples
	memPromptLogprobs
	memTopK
	memUsage
	memError
	memAttempts
	memLatency
	memMetadata
)

// scanStoredResult reads data as DecodeResult would, without decoding the samples' lists:
// ok is false when data is not as AppendJSON writes a result (see AppendOpenAIFromJSON).
func scanStoredResult(data []byte) (sc storedResult, ok bool) {
	if start := skipWS(data, 0); start >= len(data) || data[start] != '{' || !validJSON(data) {
		return sc, false
	}
	r := &sc.head
	seen := 0
	it := newObjIter(data)
	for k, v, more := it.next(); more; k, v, more = it.next() {
		bit := 0
		switch string(k) {
		case "custom_id":
			bit = memCustomID
			r.CustomID, ok = storedString(v)
		case "batch_id":
			bit = memBatchID
			r.BatchID, ok = storedString(v)
		case "status":
			bit = memStatus
			var s string
			s, ok = storedString(v)
			r.Status = Status(s)
		case "model":
			bit = memModel
			r.Model, ok = storedString(v)
		case "format":
			bit = memFormat
			r.Format, ok = storedString(v)
		case "openai_logprobs":
			bit = memOpenAILogprobs
			r.OpenAILogprobs, ok = decBool(v)
		case "samples":
			bit = memSamples
			sc.samples = v
			sc.n, ok = scanSamples(v)
		case "prompt_logprobs":
			bit = memPromptLogprobs
			_, ok = scanLogprobs(v)
		case "topk_prompt_logprobs":
			bit = memTopK
			ok = scanTopK(v)
		case "usage":
			bit = memUsage
			r.Usage, ok = scanUsage(v)
		case "error":
			bit = memError
			r.Error, ok = scanError(v)
		case "attempts":
			bit = memAttempts
			var n int64
			n, ok = storedInt(v)
			r.Attempts = int(n)
			ok = ok && n == int64(r.Attempts)
		case "latency_ms":
			bit = memLatency
			r.LatencyMS, ok = storedInt(v)
		case "metadata":
			bit = memMetadata
			ok = true // any JSON value, which is not written
		}
		if !ok || bit == 0 || seen&bit != 0 {
			return sc, false
		}
		seen |= bit
	}
	if sc.samples == nil {
		sc.samples = []byte("[]")
	}
	return sc, true
}

// scanSamples checks the samples list v and counts its samples.
func scanSamples(v []byte) (n int, ok bool) {
	if !isArray(v) {
		return 0, false
	}
	it := newArrIter(v)
	for sv, more := it.next(); more; sv, more = it.next() {
		if _, ok := scanSample(sv); !ok {
			return 0, false
		}
		n++
	}
	return n, true
}

// scanSample reads one sample object and checks its lists, which it leaves as written.
func scanSample(v []byte) (s rawSample, ok bool) {
	if !isObject(v) {
		return s, false
	}
	s.nTokens, s.nLogprobs, s.nTokenBytes = -1, -1, -1
	seen := 0
	it := newObjIter(v)
	for k, v, more := it.next(); more; k, v, more = it.next() {
		bit := 0
		switch string(k) {
		case "text":
			bit, s.text, ok = 1, v, isString(v)
		case "tokens":
			bit, s.tokens = 2, v
			s.nTokens, ok = scanInts(v, math.MinInt, math.MaxInt)
		case "logprobs":
			bit, s.logprobs = 4, v
			s.nLogprobs, ok = scanLogprobs(v)
		case "token_bytes":
			bit, s.tokenBytes = 8, v
			s.nTokenBytes, ok = scanTokenBytes(v)
		case "stop_reason":
			bit = 16
			s.stopReason, ok = storedString(v)
		}
		if !ok || bit == 0 || seen&bit != 0 {
			return s, false
		}
		seen |= bit
	}
	if s.nTokens < 0 { // null or absent: encoding/json leaves the list nil, with no elements
		s.tokens = nil
	}
	return s, true
}

// scanList checks a list whose every element elem accepts, or null (n -1), and counts its
// elements.
func scanList(v []byte, elem func([]byte) bool) (n int, ok bool) {
	if isNull(v) {
		return -1, true
	}
	if !isArray(v) {
		return 0, false
	}
	it := newArrIter(v)
	for e, more := it.next(); more; e, more = it.next() {
		if !elem(e) {
			return 0, false
		}
		n++
	}
	return n, true
}

// scanInts checks a list of integers from lo to hi, or null (n -1).
func scanInts(v []byte, lo, hi int64) (n int, ok bool) {
	return scanList(v, func(e []byte) bool {
		x, ok := storedInt(e)
		return ok && x >= lo && x <= hi
	})
}

// scanLogprobs checks a list of numbers and nulls (Logprobs), or null (n -1).
func scanLogprobs(v []byte) (n int, ok bool) {
	return scanList(v, func(e []byte) bool {
		_, ok := storedLogprob(e)
		return ok
	})
}

// scanTokenBytes checks a list of lists of bytes (TokenBytes), or null (n -1).
func scanTokenBytes(v []byte) (n int, ok bool) {
	return scanList(v, func(e []byte) bool {
		k, ok := scanInts(e, 0, 255)
		return ok && k >= 0
	})
}

// scanTopK checks topk_prompt_logprobs: null, or a list of nulls and lists of
// [token id, logprob or null] pairs.
func scanTopK(v []byte) bool {
	if isNull(v) {
		return true
	}
	if !isArray(v) {
		return false
	}
	rows := newArrIter(v)
	for row, more := rows.next(); more; row, more = rows.next() {
		if isNull(row) {
			continue
		}
		if !isArray(row) {
			return false
		}
		pairs := newArrIter(row)
		for p, more := pairs.next(); more; p, more = pairs.next() {
			if !isArray(p) {
				return false
			}
			pi := newArrIter(p)
			tok, ok1 := pi.next()
			lp, ok2 := pi.next()
			_, ok3 := pi.next()
			if !ok1 || !ok2 || ok3 {
				return false
			}
			if _, ok := storedInt(tok); !ok {
				return false
			}
			if _, ok := storedLogprob(lp); !ok {
				return false
			}
		}
	}
	return true
}

// scanUsage reads the usage object.
func scanUsage(v []byte) (*Usage, bool) {
	if !isObject(v) {
		return nil, false
	}
	u := &Usage{}
	seen := 0
	it := newObjIter(v)
	for k, v, more := it.next(); more; k, v, more = it.next() {
		var bit int
		var p *int
		switch string(k) {
		case "prompt_tokens":
			bit, p = 1, &u.PromptTokens
		case "completion_tokens":
			bit, p = 2, &u.CompletionTokens
		case "cache_hit_tokens":
			bit, p = 4, &u.CacheHitTokens
		default:
			return nil, false
		}
		n, ok := storedInt(v)
		if !ok || seen&bit != 0 || n != int64(int(n)) {
			return nil, false
		}
		*p = int(n)
		seen |= bit
	}
	return u, true
}

// scanError reads the error object.
func scanError(v []byte) (*ResultError, bool) {
	if !isObject(v) {
		return nil, false
	}
	e := &ResultError{}
	seen := 0
	it := newObjIter(v)
	for k, v, more := it.next(); more; k, v, more = it.next() {
		bit, ok := 0, false
		switch string(k) {
		case "code":
			bit = 1
			e.Code, ok = storedString(v)
		case "message":
			bit = 2
			e.Message, ok = storedString(v)
		case "category":
			bit = 4
			var c string
			c, ok = storedString(v)
			e.Category = Category(c)
		case "retryable":
			bit = 8
			e.Retryable, ok = decBool(v)
		}
		if !ok || bit == 0 || seen&bit != 0 {
			return nil, false
		}
		seen |= bit
	}
	return e, true
}

// storedString decodes a JSON string value as encoding/json does (invalid UTF-8 and lone
// surrogates become U+FFFD); ok is false for any other value.
func storedString(v []byte) (string, bool) {
	if !isString(v) {
		return "", false
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') >= 0 || !utf8.Valid(inner) {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", false
		}
		return s, true
	}
	return string(inner), true
}

// storedInt decodes a number written as an integer (an optional minus and digits) that fits
// 64 bits, which encoding/json decodes into an int as strconv.ParseInt does; ok is false for
// anything else, including numbers that encoding/json would refuse (1.0, 1e3).
func storedInt(v []byte) (int64, bool) {
	digits := v
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0') // 19 digits fit
	}
	if v[0] == '-' {
		if n > 1<<63 {
			return 0, false
		}
		return -int64(n), true //nolint:gosec // bounded above
	}
	if n > math.MaxInt64 {
		return 0, false
	}
	return int64(n), true
}

// storedLogprob decodes an element of a Logprobs list: a number as encoding/json reads it
// into a float64 (strconv.ParseFloat, which refuses one past float64's range), or null as NaN.
func storedLogprob(v []byte) (float64, bool) {
	if isNull(v) {
		return math.NaN(), true
	}
	if !isNumber(v) {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(v), 64)
	return f, err == nil
}

package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// rawJob is a job message as any publisher with NATS credentials may write it, beside
// cmd/submit: its subject's batch, headers and payload as they come.
type rawJob struct {
	batch  string
	header nats.Header
	data   []byte
	msgID  string // "" for none
}

func publishRaw(t *testing.T, q *queue.Queue, j rawJob) {
	t.Helper()
	msg := &nats.Msg{Subject: q.Names.JobSubject(j.batch), Header: j.header, Data: j.data}
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	var opts []jetstream.PublishOpt
	if j.msgID != "" {
		opts = append(opts, jetstream.WithMsgID(j.msgID))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := q.JS.PublishMsg(ctx, msg, opts...); err != nil {
		t.Fatalf("publish %s: %v", msg.Subject, err)
	}
}

func resultSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	c := jsonschema.NewCompiler()
	s, err := c.Compile(filepath.Join(filepath.Dir(file), "..", "..", "schemas", "result.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkedResults waits for n results of batch, checks each (checkResult) and that no job has
// two, and returns them by custom id.
func checkedResults(t *testing.T, q *queue.Queue, batch string, n int) map[string]jobs.Result {
	t.Helper()
	s := resultSchema(t)
	got := make(map[string]jobs.Result, n)
	for _, data := range fleettest.RawResults(t, q, batch, n, time.Minute) {
		r := checkResult(t, s, data)
		if _, dup := got[r.CustomID]; dup {
			t.Errorf("two results for %q", r.CustomID)
		}
		got[r.CustomID] = r
	}
	return got
}

// checkResult checks a result's JSON against result.schema.json, and that it holds no
// secret, and decodes it.
func checkResult(t *testing.T, s *jsonschema.Schema, data []byte) jobs.Result {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("result %s: %v", data, err)
	}
	if err := s.Validate(v); err != nil {
		t.Errorf("result %.300s does not follow result.schema.json: %v", data, err)
	}
	if bytes.Contains(data, []byte(fleettest.APIKey)) || bytes.Contains(data, []byte("tml-")) {
		t.Errorf("result holds a secret: %.300s", data)
	}
	var r jobs.Result
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("result %.300s: %v", data, err)
	}
	return r
}

func hdr(id string) nats.Header {
	h := nats.Header{}
	if id != "" {
		h.Set(queue.HeaderCustomID, id)
	}
	return h
}

// zstdHdr is hdr(id) marking a zstd payload, as results over 64 KiB are: jobs never are, and
// the worker reads the payload as it is.
func zstdHdr(id string) nats.Header {
	h := hdr(id)
	h.Set(queue.HeaderContentEncoding, "zstd")
	return h
}

func zstdOf(t *testing.T, data []byte) []byte {
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(data, nil)
}

// TestHostileJobsEachEndWithOneResult publishes odd and hostile job messages straight to the
// jobs stream, as a publisher other than submit could: each ends with exactly one result that
// follows the schema, with a fitting error code, and the worker goes on.
func TestHostileJobsEachEndWithOneResult(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 3}, tinkersim.Config{Capacity: 8})
	w := b.open(t, b.connect(t), Config{Concurrency: 4, RetryDelay: 50 * time.Millisecond})
	run(t, w)
	good := func(id string) string {
		return `{"custom_id":"` + id + `","model":"Qwen/Qwen3-8B","prompt_tokens":[1,2],"sampling_params":{"max_tokens":2},"num_samples":1}`
	}
	withParams := func(id, params string) []byte {
		return []byte(`{"custom_id":"` + id + `","model":"Qwen/Qwen3-8B","prompt_tokens":[1,2],"sampling_params":` + params + `,"num_samples":1}`)
	}
	bomb := zstdOf(t, bytes.Repeat([]byte{'a'}, 64<<20))
	nested := `{"custom_id":"nested","model":"Qwen/Qwen3-8B","prompt_tokens":[1],"num_samples":1,"metadata":` +
		strings.Repeat("[", 9000) + strings.Repeat("]", 9000) + `}`
	tooNested := `{"custom_id":"too-nested","model":"Qwen/Qwen3-8B","prompt_tokens":[1],"num_samples":1,"metadata":` +
		strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`
	cases := []struct {
		job      rawJob
		id       string // the result's custom id
		wantCode string // "" for ok
	}{
		{rawJob{batch: "h", header: hdr("ok"), data: []byte(good("ok"))}, "ok", ""},
		{rawJob{batch: "h", header: hdr(""), data: []byte(good("no-header"))}, "no-header", ""},
		{rawJob{batch: "h", header: hdr("mm-h"), data: []byte(good("mm-b"))}, "mm-h", jobs.CodeInvalidJob},
		// Its line names another job of the batch, published after it: that job keeps its
		// own result.
		{rawJob{batch: "h", header: hdr("mm-other"), data: []byte(good("real"))}, "mm-other", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("real"), data: []byte(good("real")), msgID: "h/real"}, "real", ""},
		// Without the header, invalid jobs are named by their lines, each its own result.
		{rawJob{batch: "h", header: hdr(""), data: withParams("nh-1", `{"temperature":-1}`)}, "nh-1", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr(""), data: withParams("nh-2", `{"temperature":-1}`)}, "nh-2", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: zstdHdr("zstd"), data: zstdOf(t, []byte(good("zstd")))}, "zstd", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: zstdHdr("corrupt"), data: []byte("\x28\xb5\x2f\xfdgarbage")}, "corrupt", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: zstdHdr("bomb"), data: bomb}, "bomb", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("dup"), data: []byte(`{"custom_id":"dup","custom_id":"dup","model":"Qwen/Qwen3-8B","prompt_tokens":[1],"num_samples":1}`)}, "dup", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("nested"), data: []byte(nested)}, "nested", ""},
		{rawJob{batch: "h", header: hdr("too-nested"), data: []byte(tooNested)}, "too-nested", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("temp-inf"), data: withParams("temp-inf", `{"temperature":1e999}`)}, "temp-inf", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("temp-neg"), data: withParams("temp-neg", `{"temperature":-1}`)}, "temp-neg", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("topp-nan"), data: withParams("topp-nan", `{"top_p":NaN}`)}, "topp-nan", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("maxtok-huge"), data: withParams("maxtok-huge", `{"max_tokens":99999999999999999999}`)}, "maxtok-huge", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("maxtok-neg"), data: withParams("maxtok-neg", `{"max_tokens":-5}`)}, "maxtok-neg", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("seed-huge"), data: withParams("seed-huge", `{"seed":1e30}`)}, "seed-huge", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("topk-huge"), data: withParams("topk-huge", `{"top_k":9223372036854775807}`)}, "topk-huge", ""},
		{rawJob{batch: "h", header: hdr("model"), data: []byte(`{"custom_id":"model","model":"No/Such-Model","prompt_tokens":[1],"num_samples":1}`)}, "model", jobs.CodeAPIError},
		{rawJob{batch: "h", header: hdr("header\xff"), data: []byte(good("other"))}, "header\ufffd", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("prompt-max"), data: []byte(`{"custom_id":"prompt-max","model":"Qwen/Qwen3-8B","prompt":"` + strings.Repeat("a", jobs.DefaultMaxPromptChars) + `","num_samples":1}`)}, "prompt-max", jobs.CodeContextTooLong},
		{rawJob{batch: "h", header: hdr("prompt-over"), data: []byte(`{"custom_id":"prompt-over","model":"Qwen/Qwen3-8B","prompt":"` + strings.Repeat("a", jobs.DefaultMaxPromptChars+1) + `","num_samples":1}`)}, "prompt-over", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("empty"), data: nil}, "empty", jobs.CodeInvalidJob},
		{rawJob{batch: "h", header: hdr("no-msg-id"), data: []byte(good("no-msg-id")), msgID: ""}, "no-msg-id", ""},
	}
	// A message named nowhere, neither in a header nor in a line that decodes, has no job to
	// end: it is dropped.
	unnamed := []rawJob{
		{batch: "h", header: hdr(""), data: []byte(`not json`)},
		{batch: "h", header: hdr(""), data: []byte(`{"custom_id":"","model":"Qwen/Qwen3-8B","prompt_tokens":[1],"num_samples":1}`)},
	}
	for _, j := range unnamed {
		publishRaw(t, b.results, j)
	}
	for _, c := range cases {
		publishRaw(t, b.results, c.job)
	}
	got := checkedResults(t, b.results, "h", len(cases))
	for _, c := range cases {
		r, ok := got[c.id]
		switch {
		case !ok:
			t.Errorf("no result for %q; results for %v", c.id, keys(got))
		case c.wantCode == "" && r.Status != jobs.StatusOK:
			t.Errorf("%s: %s %+v, want ok", c.id, r.Status, r.Error)
		case c.wantCode != "" && (r.Error == nil || r.Error.Code != c.wantCode):
			t.Errorf("%s: %s %+v, want %s", c.id, r.Status, r.Error, c.wantCode)
		}
	}
	if n := pendingAcks(t, b.results, 0); n != 0 {
		t.Fatalf("%d jobs not acked", n)
	}
	fleettest.Eventually(t, 10*time.Second, "every job message ended", func() bool {
		info, err := b.results.Jobs.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})
	info, err := b.results.Results.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if int(info.State.Msgs) != len(cases) {
		t.Fatalf("%d results stored, want %d: one per job, none for the messages that name none", info.State.Msgs, len(cases))
	}
}

func keys(m map[string]jobs.Result) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestJobsOnAWildcardBatchAreDropped: the jobs stream takes a job published on
// "<prefix>.jobs.*" or "<prefix>.jobs.>", whose batch would put its result on a wildcard
// subject. Such a job was sampled and its result stored there, or, published again, acked
// without a result because the look-up of its result found another batch's. It is dropped
// now, as a job on any subject that names no batch; a batch token that is no batch id submit
// takes, but no wildcard either, is a batch like any other.
func TestJobsOnAWildcardBatchAreDropped(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 3}, tinkersim.Config{Capacity: 8})
	logs := &fleettest.Buffer{}
	w := b.open(t, b.connect(t), Config{Concurrency: 4, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	run(t, w)
	publishJobs(t, b.results, "real", tokenJobs("j", 1))
	waitResults(t, b.results, "real", 1, 30*time.Second)

	again := hdr("j0000")
	again.Set(queue.HeaderRepublished, "1")
	job := func(id string) []byte {
		return []byte(`{"custom_id":"` + id + `","model":"Qwen/Qwen3-8B","prompt_tokens":[1,9],"num_samples":1}`)
	}
	publishRaw(t, b.results, rawJob{batch: "*", header: again, data: job("j0000")})
	publishRaw(t, b.results, rawJob{batch: ">", header: hdr("k"), data: job("k")})
	publishRaw(t, b.results, rawJob{batch: "bätch$", header: hdr("odd"), data: job("odd")})

	s := resultSchema(t)
	for _, data := range fleettest.RawResults(t, b.results, "bätch$", 1, 30*time.Second) {
		if r := checkResult(t, s, data); r.CustomID != "odd" || r.Status != jobs.StatusOK {
			t.Fatalf("result of a job of batch bätch$: %+v", r)
		}
	}
	fleettest.Eventually(t, 10*time.Second, "every job message ended", func() bool {
		info, err := b.results.Jobs.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})
	info, err := b.results.Results.Info(context.Background(), jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	for subject := range info.State.Subjects {
		if strings.Contains(subject, ".*.") || strings.Contains(subject, ".>.") {
			t.Errorf("a result stored on a wildcard subject, %s", subject)
		}
	}
	if got := b.sim.Stats().SamplesAccepted; got != 2 {
		t.Errorf("%d samples, want 2: none for the jobs of a wildcard batch", got)
	}
	if n := strings.Count(logs.String(), "job on an unexpected subject"); n != 2 {
		t.Errorf("%d jobs logged as on an unexpected subject, want 2:\n%s", n, logs)
	}
}

// TestAJobDeliveredAgainAfterItsResultIsStoredIsNotSampled: a job whose result is stored
// (its worker died before the ack) comes back once, is acked without a sample, and keeps its
// one result.
func TestAJobDeliveredAgainAfterItsResultIsStoredIsNotSampled(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 3}, tinkersim.Config{Capacity: 8})
	publishJobs(t, b.results, "again", tokenJobs("j", 1))
	msg := take(t, b.results, 1)[0]
	codec, err := queue.NewCodec(0)
	if err != nil {
		t.Fatal(err)
	}
	defer codec.Close()
	res := []byte(`{"custom_id":"j0000","batch_id":"again","status":"ok","samples":[],"attempts":1,"latency_ms":1}`)
	m, err := b.results.ResultMsg(nil, codec, "again", "j0000", "ok", queue.Tokens{}, res, 0)
	if err != nil {
		t.Fatal(err)
	}
	if first, err := b.results.PublishResult(context.Background(), m); err != nil || !first {
		t.Fatalf("store the result: first %v, %v", first, err)
	}
	if err := msg.Nak(); err != nil {
		t.Fatal(err)
	}
	w := b.open(t, b.connect(t), Config{Concurrency: 2})
	run(t, w)
	fleettest.Eventually(t, 10*time.Second, "the job acked", func() bool {
		info, err := b.results.Jobs.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})
	if got := b.sim.Stats().SamplesAccepted; got != 0 {
		t.Fatalf("sampled %d times, want none", got)
	}
	if got := fleettest.RawResults(t, b.results, "again", 1, 5*time.Second); len(got) != 1 || !bytes.Equal(got[0], res) {
		t.Fatalf("results %q, want the one stored first", got)
	}
}

// TestACompressedJobIsRefusedAsCompressed: submit publishes a job's line as it is, never
// compressed. A job another publisher compressed (with a Content-Encoding header, as results
// over 64 KiB carry, or without) ended as invalid_job "invalid UTF-8 at byte 2", which
// names no cause; its error says now that the message is compressed.
func TestACompressedJobIsRefusedAsCompressed(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 3}, tinkersim.Config{Capacity: 8})
	w := b.open(t, b.connect(t), Config{Concurrency: 4})
	run(t, w)
	line := func(id string) []byte {
		return []byte(`{"custom_id":"` + id + `","model":"Qwen/Qwen3-8B","prompt_tokens":[1,2],"sampling_params":{"max_tokens":2},"num_samples":1}`)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(line("gzip"))
	zw.Close()
	gzHdr := hdr("gzip-header")
	gzHdr.Set(queue.HeaderContentEncoding, "gzip")
	cases := []struct {
		job  rawJob
		id   string
		want string // in the error's message
	}{
		{rawJob{batch: "c", header: zstdHdr("zstd"), data: zstdOf(t, line("zstd"))}, "zstd", "compressed with zstd"},
		{rawJob{batch: "c", header: hdr("zstd-bare"), data: zstdOf(t, line("zstd-bare"))}, "zstd-bare", "compressed with zstd"},
		{rawJob{batch: "c", header: zstdHdr("corrupt"), data: []byte("\x28\xb5\x2f\xfdgarbage")}, "corrupt", "compressed with zstd"},
		{rawJob{batch: "c", header: hdr("gzip"), data: gz.Bytes()}, "gzip", "compressed with gzip"},
		{rawJob{batch: "c", header: gzHdr, data: []byte("not gzip")}, "gzip-header", `Content-Encoding "gzip"`},
	}
	for _, c := range cases {
		publishRaw(t, b.results, c.job)
	}
	// A compressed message without the custom id header names no job: it is dropped, and
	// ends without a result, as before.
	publishRaw(t, b.results, rawJob{batch: "c", header: hdr(""), data: zstdOf(t, line("unnamed"))})
	got := checkedResults(t, b.results, "c", len(cases))
	for _, c := range cases {
		r, ok := got[c.id]
		switch {
		case !ok:
			t.Errorf("no result for %q; results for %v", c.id, keys(got))
		case r.Error == nil || r.Error.Code != jobs.CodeInvalidJob:
			t.Errorf("%s: %s %+v, want invalid_job", c.id, r.Status, r.Error)
		case !strings.Contains(r.Error.Message, c.want) || !strings.Contains(r.Error.Message, "not compressed"):
			t.Errorf("%s: error %q, want one that says the job is %s and job messages are not compressed", c.id, r.Error.Message, c.want)
		}
	}
	fleettest.Eventually(t, 10*time.Second, "every job message ended", func() bool {
		info, err := b.results.Jobs.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})
	if info, err := b.results.Results.Info(context.Background()); err != nil || int(info.State.Msgs) != len(cases) {
		t.Fatalf("results stored: %+v, %v; want %d", info, err, len(cases))
	}
}

package tinkersim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
)

// This file holds the server-side wire structs and the strict request decoding. The real
// service validates request bodies strictly (pydantic models, §3 conventions): unknown fields,
// wrong types, missing required fields and wrong "type" literals are rejected with a 4xx.

// httpError is an error that already knows its HTTP status and JSON body.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return fmt.Sprintf("%d: %s", e.status, e.msg) }

func badRequest(format string, args ...any) *httpError {
	return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func unprocessable(format string, args ...any) *httpError {
	return &httpError{status: http.StatusUnprocessableEntity, msg: fmt.Sprintf(format, args...)}
}

// decodeStrict reads a JSON object into v, rejecting unknown fields, mistyped values and
// trailing data. Malformed JSON is a 400; schema violations are a 422 (FastAPI style). Both
// carry a JSON body with a Content-Length (§1.4: a bare 400 would be mistaken by the SDK for a
// Cloudflare rejection).
func decodeStrict(r *http.Request, maxBytes int64, v any) *httpError {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBytes+1))
	if err != nil {
		return badRequest("reading request body: %v", err)
	}
	if int64(len(body)) > maxBytes {
		return &httpError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body exceeds %d bytes", maxBytes)}
	}
	return decodeBytesStrict(body, v)
}

// decodeBytesStrict is decodeStrict on a body already read.
func decodeBytesStrict(body []byte, v any) *httpError {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || (trimmed[0] != '{' && trimmed[0] != '[') {
		return badRequest("request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		var synErr *json.SyntaxError
		switch {
		case errors.As(err, &typeErr):
			return unprocessable("field %q: expected %s, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
		case errors.As(err, &synErr), errors.Is(err, io.ErrUnexpectedEOF):
			return badRequest("malformed JSON: %v", err)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return unprocessable("%s", strings.TrimPrefix(err.Error(), "json: "))
		default:
			return unprocessable("invalid request body: %v", err)
		}
	}
	if dec.More() {
		return badRequest("malformed JSON: trailing data after the request object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("malformed JSON: trailing data after the request object")
	}
	if _, e := exactKeys(trimmed, 0, reflect.TypeOf(v)); e != nil {
		return e
	}
	return nil
}

// exactKeys walks the JSON value at b[i:], which decoded into a value of type t (nil: any),
// and returns the index after it. It refuses an object key that names a field of a struct
// only in another case: encoding/json matches "SEQ_ID" to seq_id, while the service's field
// names are case-sensitive (pydantic), so there it is an unknown field. b is valid JSON
// (decoded already), so the walk only looks for keys.
func exactKeys(b []byte, i int, t reflect.Type) (int, *httpError) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	i = skipSpace(b, i)
	switch b[i] {
	case '{':
		i = skipSpace(b, i+1)
		for b[i] != '}' {
			end := skipString(b, i)
			var elem reflect.Type
			switch {
			case t == nil:
			case t.Kind() == reflect.Map:
				elem = t.Elem()
			case t.Kind() == reflect.Struct:
				key := b[i+1 : end-1]
				if bytes.IndexByte(key, '\\') >= 0 {
					var s string
					if err := json.Unmarshal(b[i:end], &s); err != nil {
						return 0, badRequest("malformed JSON: %v", err)
					}
					key = []byte(s)
				}
				f, ok := fieldByJSONName(t, key)
				if !ok {
					return 0, unprocessable("unknown field %q", key)
				}
				elem = f.Type
			}
			var e *httpError
			if i, e = exactMember(b, skipSpace(b, end)+1, elem); e != nil { // past the colon
				return 0, e
			}
		}
		return i + 1, nil
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		i = skipSpace(b, i+1)
		for b[i] != ']' {
			var e *httpError
			if i, e = exactMember(b, i, elem); e != nil {
				return 0, e
			}
		}
		return i + 1, nil
	case '"':
		return skipString(b, i), nil
	}
	for i < len(b) && !strings.ContainsRune(",]} \t\r\n", rune(b[i])) { // a number, true, false or null
		i++
	}
	return i, nil
}

// exactMember is exactKeys for a member of an object or an array: it returns the index of
// what follows the member and its comma, if one follows.
func exactMember(b []byte, i int, t reflect.Type) (int, *httpError) {
	i, e := exactKeys(b, i, t)
	if e != nil {
		return 0, e
	}
	if i = skipSpace(b, i); b[i] == ',' {
		i = skipSpace(b, i+1)
	}
	return i, nil
}

// skipSpace returns the index of the first byte at or after i that is not JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// skipString returns the index after the JSON string that starts at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// fieldByJSONName returns the field of struct t whose JSON name is exactly name.
func fieldByJSONName(t reflect.Type, name []byte) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "" {
			tag = f.Name
		}
		if f.IsExported() && tag == string(name) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// checkLiteral enforces a "type" discriminator: absent is allowed when optional, otherwise it
// must be exactly want.
func checkLiteral(field string, got *string, want string, required bool) *httpError {
	if got == nil {
		if required {
			return unprocessable("field %q is required", field)
		}
		return nil
	}
	if *got != want {
		return unprocessable("field %q must be %q, got %q", field, want, *got)
	}
	return nil
}

// sdkVersionRequest is the body of client/config and client/dynamic_config (§3.1).
type sdkVersionRequest struct {
	SDKVersion *string `json:"sdk_version"`
}

// createSessionRequest is the body of create_session (§3.3).
type createSessionRequest struct {
	Tags         []string       `json:"tags"`
	UserMetadata map[string]any `json:"user_metadata"`
	SDKVersion   *string        `json:"sdk_version"`
	ProjectID    *string        `json:"project_id"`
	Type         *string        `json:"type"`
}

// heartbeatRequest is the body of session_heartbeat (§3.4).
type heartbeatRequest struct {
	SessionID *string `json:"session_id"`
	Type      *string `json:"type"`
}

// createSamplingSessionRequest is the body of create_sampling_session (§3.5).
type createSamplingSessionRequest struct {
	SessionID            *string `json:"session_id"`
	SamplingSessionSeqID *int64  `json:"sampling_session_seq_id"`
	BaseModel            *string `json:"base_model"`
	ModelPath            *string `json:"model_path"`
	Type                 *string `json:"type"`
}

// chunk is one element of ModelInput.chunks, a union discriminated by "type" (§T1).
type chunk struct {
	Type           *string  `json:"type"`
	Tokens         *[]int32 `json:"tokens"`
	Data           *[]byte  `json:"data"` // standard base64 on the wire
	Format         *string  `json:"format"`
	ExpectedTokens *int     `json:"expected_tokens"`
	Location       *string  `json:"location"`
	Dmel           *[]byte  `json:"dmel"`
}

// modelInput is ModelInput (§T1).
type modelInput struct {
	Chunks *[]chunk `json:"chunks"`
}

var seedType = reflect.TypeFor[uint64]()

// seedValue is SamplingParams.seed: any 64-bit integer, signed or unsigned (§T2, §T4 note).
type seedValue uint64

// UnmarshalJSON accepts an integer literal that fits int64 or uint64.
func (s *seedValue) UnmarshalJSON(b []byte) error {
	txt := string(b)
	if v, err := strconv.ParseInt(txt, 10, 64); err == nil {
		*s = seedValue(uint64(v))
		return nil
	}
	if v, err := strconv.ParseUint(txt, 10, 64); err == nil {
		*s = seedValue(v)
		return nil
	}
	return &json.UnmarshalTypeError{Value: "non-integer " + txt, Type: seedType, Field: "sampling_params.seed"}
}

// samplingParams is SamplingParams (§T2).
type samplingParams struct {
	MaxTokens   *int            `json:"max_tokens"`
	Seed        *seedValue      `json:"seed"`
	Stop        json.RawMessage `json:"stop"`
	Temperature *float64        `json:"temperature"`
	TopK        *int            `json:"top_k"`
	TopP        *float64        `json:"top_p"`
}

// sampleRequest is SampleRequest, the body of asample (§3.6).
type sampleRequest struct {
	NumSamples         *int            `json:"num_samples"`
	Prompt             *modelInput     `json:"prompt"`
	SamplingParams     *samplingParams `json:"sampling_params"`
	BaseModel          *string         `json:"base_model"`
	ModelPath          *string         `json:"model_path"`
	SamplingSessionID  *string         `json:"sampling_session_id"`
	SeqID              *int64          `json:"seq_id"`
	PromptLogprobs     *bool           `json:"prompt_logprobs"`
	TopkPromptLogprobs *int            `json:"topk_prompt_logprobs"`
	Type               *string         `json:"type"`
}

// retrieveFutureRequest is the body of retrieve_future (§3.7).
type retrieveFutureRequest struct {
	RequestID         *string `json:"request_id"`
	AllowMetadataOnly *bool   `json:"allow_metadata_only"`
}

// telemetryRequest is the body of telemetry (§3.12); events are opaque.
type telemetryRequest struct {
	Events      []json.RawMessage `json:"events"`
	Platform    *string           `json:"platform"`
	SDKVersion  *string           `json:"sdk_version"`
	SessionID   *string           `json:"session_id"`
	ProcessUUID *string           `json:"process_uuid"`
}

// weightsInfoRequest is the body of weights_info (§3.11).
type weightsInfoRequest struct {
	TinkerPath *string `json:"tinker_path"`
}

// stopSpec is a parsed SamplingParams.stop: strings or token ids, never both (§T2).
type stopSpec struct {
	strs   []string
	tokens []int32
}

// parseStop reads stop as null, a string, a list of strings or a list of token ids.
func parseStop(raw json.RawMessage) (stopSpec, *httpError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return stopSpec{}, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return stopSpec{}, unprocessable("field \"sampling_params.stop\": %v", err)
		}
		return stopSpec{strs: []string{s}}, nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return stopSpec{}, unprocessable("field \"sampling_params.stop\": %v", err)
		}
		var spec stopSpec
		for i, it := range items {
			it = bytes.TrimSpace(it)
			if len(it) > 0 && it[0] == '"' {
				var s string
				if err := json.Unmarshal(it, &s); err != nil {
					return stopSpec{}, unprocessable("field \"sampling_params.stop[%d]\": %v", i, err)
				}
				spec.strs = append(spec.strs, s)
				continue
			}
			var tok int32
			if err := json.Unmarshal(it, &tok); err != nil {
				return stopSpec{}, unprocessable("field \"sampling_params.stop[%d]\": expected a string or an int32 token id", i)
			}
			spec.tokens = append(spec.tokens, tok)
		}
		if len(spec.strs) > 0 && len(spec.tokens) > 0 {
			return stopSpec{}, unprocessable("field \"sampling_params.stop\": stop strings and stop token ids cannot be mixed")
		}
		return spec, nil
	default:
		return stopSpec{}, unprocessable("field \"sampling_params.stop\": expected a string, a list of strings or a list of token ids")
	}
}

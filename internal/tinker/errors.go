package tinker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// ErrProgressTimeout is returned (wrapped) by [Sampler.Sample] when no request
// through the sampler made progress for Timing.ProgressTimeout (7200 s by
// default): the stuck detection of §6.3. It is not retried.
var ErrProgressTimeout = errors.New("tinker: no progress made; requests appear to be stuck")

// ErrFutureTimeout is returned (wrapped) by [Sampler.Sample] when the service has not
// answered a future within Config.FutureTimeout of accepting it (a future it lost, or
// hung). It is not retried.
var ErrFutureTimeout = errors.New("tinker: the service has not answered the future")

// ErrClosed is returned by calls on a [Client] after [Client.Close].
var ErrClosed = errors.New("tinker: client closed")

// StatusError is a non-success HTTP reply (§7.1). Body is the reply body, truncated
// and with any occurrence of the API key or of a JWT (§2.2) removed.
type StatusError struct {
	Method     string // HTTP method
	Endpoint   string // endpoint name, e.g. "asample"
	StatusCode int    // HTTP status code
	Body       string // truncated reply body, credentials redacted
}

// Error implements error.
func (e *StatusError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("tinker: %s %s: error code %d", e.Method, e.Endpoint, e.StatusCode)
	}
	return fmt.Sprintf("tinker: %s %s: error code %d - %s", e.Method, e.Endpoint, e.StatusCode, e.Body)
}

// Category is the failure category of a failed future (§7.2).
type Category string

// The categories a failed future can carry; anything unrecognised is CategoryUnknown.
const (
	CategoryUnknown Category = "unknown"
	CategoryServer  Category = "server"
	CategoryUser    Category = "user"
)

func parseCategory(s string) Category {
	switch Category(s) {
	case CategoryServer, CategoryUser:
		return Category(s)
	}
	return CategoryUnknown
}

// RequestFailedError is a future that completed as failed: a 200 reply to
// retrieve_future carrying an "error" key (§4.2). It is terminal and never retried
// automatically (§6.3), but the category lets a caller decide.
type RequestFailedError struct {
	Category  Category // user, server or unknown
	Message   string   // the server's error text
	RequestID string   // the future's request id
}

// Error implements error.
func (e *RequestFailedError) Error() string {
	return fmt.Sprintf("tinker: request %s failed (%s error): %s", e.RequestID, e.Category, e.Message)
}

// ConnectionError is a failure to get any HTTP reply: a transport error, a
// per-request timeout, or a bare 400 without a body that the client treats as a
// connection-level rejection (§1.4). It is retryable at every layer.
type ConnectionError struct {
	Endpoint string // endpoint name
	Timeout  bool   // the per-request timeout expired
	Err      error  // the underlying error
}

// Error implements error.
func (e *ConnectionError) Error() string {
	if e.Timeout {
		return fmt.Sprintf("tinker: %s: request timed out: %v", e.Endpoint, e.Err)
	}
	return fmt.Sprintf("tinker: %s: connection error: %v", e.Endpoint, e.Err)
}

// Unwrap returns the underlying error.
func (e *ConnectionError) Unwrap() error { return e.Err }

// ProtocolError is a reply the client cannot use: an undecodable result, an
// unexpected shape, a repeated complete_metadata, or a poll status that §4.2
// makes fatal (then Err is the *StatusError). It is never retried.
type ProtocolError struct {
	Endpoint string // endpoint name
	Msg      string // what was wrong
	Err      error  // optional underlying error
}

// Error implements error.
func (e *ProtocolError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("tinker: %s: %s: %v", e.Endpoint, e.Msg, e.Err)
	}
	return fmt.Sprintf("tinker: %s: %s", e.Endpoint, e.Msg)
}

// Unwrap returns the underlying error.
func (e *ProtocolError) Unwrap() error { return e.Err }

// IsRetryable reports whether the sample-level retry layer (§6.3) retries err:
// connection errors and request timeouts, HTTP 408, 409, 429 and 5xx, and a poll's 410 (its
// future expired: the sample is submitted again, §4.2). Failed futures, protocol errors, other
// 4xx (410 from any other endpoint too, §5.3), the caller's context ending,
// ErrProgressTimeout and ErrFutureTimeout are not retryable.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, ErrProgressTimeout) || errors.Is(err, ErrFutureTimeout) {
		return false
	}
	var pe *ProtocolError
	if errors.As(err, &pe) {
		return false
	}
	var ce *ConnectionError
	if errors.As(err, &ce) {
		// Before the context errors: a request's own timeout wraps context.DeadlineExceeded,
		// and the caller's context ending is never a ConnectionError.
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.StatusCode == http.StatusGone && se.Endpoint == "retrieve_future" || retryableStatus(se.StatusCode)
	}
	return false
}

// CredentialRefused reports whether err is a reply of 401 (AuthenticationError) or 403
// (PermissionDeniedError) from any endpoint (§7.1): the service refused the credential, or
// refused it what the request asked for. Client.CheckCredential tells the two apart.
func CredentialRefused(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.StatusCode == http.StatusUnauthorized || se.StatusCode == http.StatusForbidden)
}

// retryableStatus is the status set of §6.1/§6.2: 408, 409, 429 and 5xx.
func retryableStatus(code int) bool {
	return code == 408 || code == 409 || code == 429 || (code >= 500 && code <= 599)
}

// Package tinker is a Go client for the sampling path of the Tinker API, written
// against the wire-protocol notes in docs/tinker-wire-protocol.md (section numbers
// such as §4.2 in comments refer to that document).
//
// A [Client] is created with [Dial], which performs the start-up sequence of the
// reference SDK (§2): POST client/config for the server flags (§3.1), the JWT
// exchange when the server sets pjwt_auth_enabled (§2.2), POST client/dynamic_config
// (a 404 means defaults), POST create_session (§3.3), and then a heartbeat every 10 s
// (§3.4) owned by the client and stopped by [Client.Close].
//
// A session the service no longer knows (it restarted, or ended the session after
// heartbeats it missed) is replaced, unlike in the SDK, which keeps it and fails every
// sampler made later: a heartbeat answered 404 creates a new session, and so does a
// create_sampling_session answered 404 when a heartbeat confirms the session is gone (a 404
// there may also be a checkpoint the service does not have). A [Sampler] of the old session
// fails its samples with the asample 404; its owner makes a new one.
//
// JWT exchange (§2.2): POST auth/token with the API key (10 HTTP retries, §3.2) returns
// a JWT that every later request sends as X-API-Key instead of the key. Its payload's
// exp is read (no signature check); a goroutine owned by the client re-mints it
// [Timing].JWTRefreshBeforeExpiry (300 s) before expiry, retrying every
// JWTRefreshRetry (60 s) after a failure, and a request that finds no more than
// JWTRefreshOnDemand (60 s) left refreshes it first. An API key that is itself a JWT
// ("eyJ…") is sent as it is where the server does not exchange, and exchanged like a key
// where it does (as the SDK's code does; §2.1 reads "used directly"). A credential command
// (TINKER_CREDENTIAL_CMD, [Config].CredentialCmd) is a shell command whose trimmed output is
// the credential: it runs for every token fetch, for client/config when there is no API key
// and for each exchange whose source it is (no API key, or credential_default_source
// "credential_cmd" and an API key that is not a JWT; that flag without a command fails Dial,
// as in the SDK); without an API key it serves only a server that exchanges JWTs.
//
// [Client.NewSampler] creates a sampling session (§3.5) for a base model or a
// tinker:// model path. [Sampler.Sample] runs one sample the way §5.1 and §6.3
// describe: estimate the prompt bytes, allocate a seq_id, pass the [Dispatcher]
// gate, submit POST asample through the 300 s submission retry loop (§6.2),
// back off through the Dispatcher on 429 (and on 402 inside the billing window),
// release the gate, and long-poll POST retrieve_future (§4) with no permits held,
// classifying every reply as the table of §4.2 says. A retryable failure re-runs
// the whole attempt with a new seq_id (§6.3) until the 2 h no-progress limit.
//
// The three retry layers of §6 are separate and each has its own numbers in
// [Timing]: the HTTP layer (§6.1, x-should-retry and Retry-After), the submission
// loop (§6.2) and the sample-level retry (§6.3). Every HTTP request, 429, 402,
// queue-state notification and retry is reported through [Config.OnEvent] so that
// dispatch, backoff and metrics code can act on them.
//
// Sample results arrive as protobuf (§T4), decoded by hand with protowire; the
// JSON shape of §T3 is accepted too. The schema is in schemas/tinker_public.proto.
//
// Errors are typed: [*StatusError], [*RequestFailedError] (with its [Category]),
// [*ConnectionError], [*ProtocolError] and [ErrProgressTimeout]; [IsRetryable]
// tells whether the sample-level layer would retry an error. A 401 or 403 ([CredentialRefused])
// is about the credential or about what one request asked for; [Client.CheckCredential]
// asks the service which, minting a new JWT first when the exchange is on. The API key is an
// [APIKey], whose String, GoString, Format, LogValue and MarshalText methods all
// print a redacted form; the key, the credential command's output and the JWTs only ever
// leave the process in the X-API-Key header, and error bodies are scrubbed of them.
//
// Without [Config].HTTPClient, the client's own transport offers HTTP/2 (§1.4) and pings a
// connection that has been silent for 10 s, closing it when the pong is 10 s late: a link
// that died without closing would otherwise take every request to its timeout, try after
// try, since HTTP/2 sends them all over that one connection.
//
// Every call takes a context.Context and returns promptly when it is cancelled.
package tinker

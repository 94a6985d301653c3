// Package tinkersim is a wire-compatible simulator of the Tinker sampling service: an
// http.Handler that speaks the protocol of docs/tinker-wire-protocol.md (§ numbers below refer
// to it) from the server side, models a backend with a capacity and a latency, injects faults
// and counts what it saw. It is an independent reading of the protocol: it does not import
// internal/tinker, so the client and the simulator test each other.
//
// # Starting it
//
// In tests, wrap it in an httptest server; the base URL is the test server's URL:
//
//	sim, err := tinkersim.New(tinkersim.Config{APIKeys: []string{"tml-test"}, LongPollWait: 50 * time.Millisecond})
//	if err != nil { t.Fatal(err) }
//	ts := httptest.NewServer(sim)
//	t.Cleanup(func() { ts.Close(); sim.Close() })
//	// client base URL: ts.URL
//
// or let it listen itself: baseURL, err := sim.Listen(ctx, "127.0.0.1:0") (stopped when ctx
// ends or by Close/Shutdown). The program cmd/tinkersim does the latter. ListenTLS serves HTTPS
// with HTTP/2, as the real service (§1.4), on a self-signed certificate it returns the roots of;
// cmd/tinkersim takes -tls-cert and -tls-key.
//
// # Paths
//
// The API is served under any path containing /api/v1/, so the handler works at the root, under
// a mount prefix stripped with http.StripPrefix("/services/tinker-prod", sim), or unstripped
// (a client whose base URL is http://host/services/tinker-prod reaches
// /services/tinker-prod/api/v1/asample, §1.1). Admin endpoints live under any path containing
// /admin/: POST /admin/faults (a fault object or a list, e.g. {"kind":"429","duration":"30s"}),
// GET and DELETE /admin/faults, DELETE /admin/faults/{id}, GET /admin/stats, POST /admin/reset,
// POST /admin/forget_sessions (Server.ForgetSessions: a restart of the service), and PUT
// /admin/api_keys ({"api_keys":[…]}: Server.SetAPIKeys, a key rotation).
// They take X-Admin-Token when Config.AdminToken is set, else a valid X-API-Key.
//
// Endpoints: POST client/config, client/dynamic_config, auth/token, create_session,
// session_heartbeat, create_sampling_session, asample, retrieve_future, telemetry,
// weights_info; GET samplers/{id}, get_server_capabilities, healthz, checkpoints,
// training_runs, training_runs/{id}, training_runs/{id}/checkpoints, sessions, sessions/{id}
// (§12, §3.14; listings page with offset/limit and return a cursor {offset, limit,
// total_count}). auth/token answers 404 unless Config.JWTAuth is set (§12: only needed when
// pjwt_auth_enabled is true).
//
// # Behaviour
//
//   - Authentication: X-API-Key must be one of Config.APIKeys (any "tml-…" key when none are
//     configured; Server.SetAPIKeys replaces them, as a key rotation does); otherwise 401 with
//     a JSON body.
//   - JWT exchange (§2.2, §3.2), with Config.JWTAuth (cmd: -jwt-auth): client/config answers
//     pjwt_auth_enabled true; POST auth/token with body {} and an accepted API key (or a JWT
//     of this server, exchanged for a fresh one of the same sub, as the SDK exchanges a JWT
//     credential) returns
//     {"jwt": …}, a JWT with header {"alg":"HS256","typ":"JWT"} and claims sub, email, iat and
//     exp (at least Config.JWTLifetime, default 1 h, after iat), signed with HMAC-SHA256 under a
//     random secret of this server. Every other API endpoint except client/config and
//     auth/token (which take an API key or such a JWT) then requires a valid, unexpired JWT of this server in
//     X-API-Key: a plain API key, a tampered, foreign or expired JWT get 401 with a JSON detail
//     (counted in Stats.JWTRejections). Server.RevokeJWTs invalidates every JWT minted so far.
//     Admin endpoints keep their own authentication.
//   - Validation is strict like the real service: unknown or mistyped fields (field names are
//     case-sensitive: "SEQ_ID" is not seq_id), missing required fields and wrong "type"
//     literals give 422 with {"detail": …}; malformed JSON gives 400
//     with a body. Every JSON reply carries a Content-Length (§1.4).
//   - Sessions never expire unless Config.SessionTimeout is set (cmd: -session-timeout): then
//     a session that went that long without a heartbeat is forgotten with its sampling
//     sessions, which answer 404 like a restart's (§3.4 says the service presumably expires
//     them, without a figure). Stats.SessionsExpired counts them.
//   - asample returns {"request_id": "<sampling_session_id>:<seq_id>"} (§8); a repeated
//     (sampling_session_id, seq_id) returns the same id without new work.
//   - Capacity: each accepted asample (whatever its num_samples) holds one slot from acceptance
//     until it completes, BaseLatency + PerTokenLatency × the longest sequence later. When all
//     slots are taken, asample with X-Tinker-Sampling-Backpressure: 1 answers 429 with
//     Retry-After (and Retry-After-Ms) and a JSON body; without the header it queues (FIFO).
//   - retrieve_future long-polls up to LongPollWait (default 25 s, below the SDK's 45 s), then
//     answers 408 {"type":"try_again","request_id":…,"queue_state":…}. A finished future
//     answers protobuf SampleResponse (§T4) when Accept contains application/x-protobuf, the
//     JSON shape of §T3 otherwise, or 200 {"error","category"} when it failed (a prompt plus
//     max_tokens beyond the model's context is a "user" failure). Unknown, dropped or expired
//     futures answer 410: a future expires ResultTTL after completion, or ReadTTL after its
//     outcome was first answered in full, whichever comes first.
//
// # The generator
//
// Outputs are a pure function of the prompt tokens, sampling_params.seed (0 when absent) and
// the sample index; temperature, top_k and top_p are validated but do not change them.
//   - Length: a target L is drawn uniformly in [min(MinGenTokens, max_tokens), max_tokens].
//     Reaching max_tokens gives stop reason "length"; ending before gives "stop".
//   - Tokens are drawn uniformly in [TokenMin, TokenMax) (default [1000, 100000)).
//   - Stop token ids: each position is one of them with probability StopTokenProbability
//     (default 0.05), and the natural end L < max_tokens emits one too; a stop id ends the
//     sequence and is returned as its last token. A random token equal to a stop id also ends it.
//   - Stop strings: generated text is never matched against them; the natural end L <
//     max_tokens counts as the stop string having been produced (it is not returned), as does
//     the natural end without any stop (the end-of-sequence token is not returned).
//   - Per-token logprobs are always returned, multiples of 1/1024 in (-8, 0]. Prompt logprobs
//     (when prompt_logprobs is true) have NaN/null at position 0. Top-k prompt logprobs
//     (k = min(topk_prompt_logprobs, 20)) have an empty first row and k consecutive token ids
//     with decreasing logprobs elsewhere. prompt_cache_hit_tokens is always 0.
//
// # Faults and stats
//
// Faults (see FaultKind) come from Config.Faults, Server.Inject / SetFaults / RemoveFault /
// ClearFaults, the cmd's -fault flags (ParseFault) or POST /admin/faults. Each has a window
// (Start, Duration), an optional Rate drawn from an RNG seeded with Config.Seed, so a given
// request sequence is reproducible, and an optional Count of requests it hits (Count 1 on a
// 429: a lone 429). Kinds that answer with a status (429, 402, 5xx, 408, bare_400) or with
// nothing (drop: a connection error) may name any API endpoint: endpoints auth/token is an
// outage of the JWT exchange. Fault.ShouldRetry ("true" or "false") adds x-should-retry to
// the replies of a kind that answers with a status (429, 5xx, 408, 402, bare_400, 401, 403),
// the header the SDK's HTTP retry layer obeys over the status (§6.1); asample, polls and
// heartbeats have no HTTP-level retries (§1.3, §3.6) and do not consult it. Server.Stats
// (GET /admin/stats) reports requests by endpoint and status, samples
// accepted/completed/failed, JWTs minted and JWT refusals, peak
// concurrency, the TCP connections accepted (whether a client keeps its connections, §1.4)
// and, for every 429, 402, 401 and pause window, how many asample calls arrived inside it.
package tinkersim

// Package jobs defines tinkerfleet's line formats: the job line a user submits, the Job message
// that travels through NATS to the workers, and the result line that comes back. It validates
// jobs and maps OpenAI Batch API lines onto Jobs. It imports only the standard library (and
// internal/ftoa, which writes logprobs) and does no I/O beyond reading the io.Reader it is given.
//
// # Job lines
//
// A JSONL input holds one job per line (schemas/job.schema.json). Each line is detected on its
// own:
//
//   - a native line has custom_id, model or model_path, exactly one of prompt, prompt_tokens or
//     messages (with thinking or reasoning_effort for a chat), and optional sampling_params
//     (max_tokens, temperature, top_p, top_k, seed, stop), num_samples, prompt_logprobs,
//     topk_prompt_logprobs and metadata (§3.6, §T2);
//   - a line with body, url or method is an OpenAI Batch API request to /v1/completions or
//     /v1/chat/completions; n becomes num_samples, max_completion_tokens is max_tokens, a model
//     starting with tinker:// is a model_path, and body.metadata is the job's metadata. Body fields
//     that Tinker cannot honour are rejected unless they hold their OpenAI default (see openai.go
//     and the schema's description for the exact rule).
//
// Reader streams a file through a fixed buffer and reports every bad line as a *LineError such as
//
//	prompts.jsonl:12: field sampling_params.max_tokens: must be a positive integer of at most 32768
//
// then goes on with the next line, so a submitter can list all problems in one pass. Unknown,
// repeated and mistyped fields are errors, named by their path as written in the line. Metadata is
// kept byte for byte from the input line to the result line.
//
// # Job messages
//
// Job.Encode / DecodeJob are the compact JSON body of a NATS job message: the native line plus a
// "format" field saying where the job came from. Workers decode and call Validate again, since a
// message may come from another producer or version.
//
// # Result lines
//
// Result is one line of output (schemas/result.schema.json; AppendOpenAI writes it in the OpenAI
// Batch output format, schemas/openai-result.schema.json): status ok, error or cancelled, the
// samples with their tokens and logprobs, prompt logprobs when asked, usage, and for failures a
// ResultError with a Code*, a category (§7.2) and whether a retry may help.
// AppendOpenAIFromJSON writes a stored line in the OpenAI format without decoding it whole,
// one sample at a time, with DecodeResult's checks and errors. NewResult,
// ErrorResult, CancelledResult and InvalidJobResult fill in the job's identity and metadata.
package jobs

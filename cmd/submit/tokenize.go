package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

const tokenizeUsage = `usage: submit tokenize (--model NAME | --tokenizer PATH) [--count | --decode [--raw]] [--json]
       submit tokenize --jobs [--model NAME] [--tokenizer PATH] < prompts.jsonl

Reads one item per line on stdin and writes one result per line on stdout.
  encode (default)  text line -> JSON array of token ids, e.g. [9707,11,1879]
  --count           text line -> number of tokens
  --decode          JSON array of ids -> JSON string of the text (--raw: the text itself)
  --jobs            job line (native or OpenAI) -> the prompt a worker sends for it:
                    {"custom_id","prompt_tokens","prompt" (their text),"stop"} (the
                    job's own stop with its chat template's stop tokens beside it),
                    chats rendered with their model's template, thinking as the job says;
                    each job's model finds its tokenizer, and --model names the base
                    model of model_path jobs (--tokenizer, if given, serves every job);
                    a line that cannot be rendered is named on stderr, the others go on
Input lines lose their trailing "\n" only; with --json each input line is a JSON
string instead, so texts may hold newlines. A line may be 8 MiB long, as in a job
file; a longer one is an error naming it. Special tokens written in the text
(e.g. <|im_end|>) are encoded as their ids.
--model finds the tokenizer like the Tinker SDK (TINKERFLEET_TOKENIZER_DIR, the
HuggingFace cache under HF_HOME, else a download from HF_ENDPOINT with HF_TOKEN);
Qwen3's is built in, and needs none of them.
`

// runTokenize is the `submit tokenize` subcommand.
func runTokenize(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, tokenizeUsage); fs.PrintDefaults() }
	model := fs.String("model", "", "model name, e.g. Qwen/Qwen3-8B (tokenizer found as in §9)")
	path := fs.String("tokenizer", "", "tokenizer.json, tokenizer.json.zst, or a directory holding one")
	decode := fs.Bool("decode", false, "read JSON arrays of ids and print the decoded text")
	raw := fs.Bool("raw", false, "with --decode, print the text itself instead of a JSON string")
	count := fs.Bool("count", false, "print the number of tokens of each line")
	jsonIn := fs.Bool("json", false, "each input line is a JSON string (encode and --count)")
	jobLines := fs.Bool("jobs", false, "each input line is a job line: print the prompt a worker sends for it")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("tokenize: unexpected arguments %q", fs.Args())
	}
	if *path == "" && (*model != "" || *jobLines) { // else the tokenizer at path serves every line
		if err := tokenizer.CheckDir(os.Getenv("TINKERFLEET_TOKENIZER_DIR")); err != nil {
			return fmt.Errorf("tokenize: TINKERFLEET_TOKENIZER_DIR %w", err)
		}
	}
	if *jobLines {
		if *decode || *count || *raw || *jsonIn {
			return errors.New("tokenize: --jobs takes no --decode, --count, --raw or --json")
		}
		return renderJobs(ctx, stdin, stdout, stderr, *model, *path)
	}
	if (*model == "") == (*path == "") {
		return errors.New("tokenize: give exactly one of --model or --tokenizer")
	}
	if *decode && *count {
		return errors.New("tokenize: --decode and --count exclude each other")
	}
	if *raw && !*decode {
		return errors.New("tokenize: --raw only applies to --decode")
	}
	var tok *tokenizer.Tokenizer
	var err error
	if *path != "" {
		tok, err = tokenizer.Load(*path)
	} else {
		tok, err = tokenizer.NewRegistry(tokenizer.OptionsFromEnv(os.Getenv)).ForModel(ctx, *model)
	}
	if err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}

	in := bufio.NewReaderSize(stdin, 1<<20)
	out := bufio.NewWriterSize(stdout, 1<<16)
	for lineNo := 1; ; lineNo++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("tokenize: %w", err)
		}
		// The same bound as a job file's lines (8 MiB), which a prompt at its limit fits in
		// however it is escaped.
		b, rerr := readLine(in, jobs.DefaultMaxLineBytes)
		if errors.Is(rerr, errLineTooLong) {
			out.Flush() // the lines before it first
			return fmt.Errorf("tokenize: line %d: longer than the limit of %d bytes of an input line", lineNo, jobs.DefaultMaxLineBytes)
		}
		if rerr != nil && rerr != io.EOF {
			return fmt.Errorf("tokenize: read stdin: %w", rerr)
		}
		if len(b) == 0 && rerr == io.EOF {
			break
		}
		line := strings.TrimSuffix(string(b), "\n")
		if err := tokenizeLine(tok, line, lineNo, *decode, *raw, *count, *jsonIn, out); err != nil {
			out.Flush()
			return err
		}
		if rerr == io.EOF {
			break
		}
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("tokenize: write: %w", err)
	}
	return nil
}

func tokenizeLine(tok *tokenizer.Tokenizer, line string, lineNo int, decode, raw, count, jsonIn bool, out *bufio.Writer) error {
	if decode {
		var ids []int
		if err := json.Unmarshal([]byte(line), &ids); err != nil {
			// encoding/json quotes a number that is too large whole, megabytes of digits.
			return fmt.Errorf("tokenize: line %d: want a JSON array of ids: %s", lineNo, jobs.Clip(err.Error()))
		}
		if ids == nil { // null, which Unmarshal takes for no array at all: [] is an empty one
			return fmt.Errorf("tokenize: line %d: want a JSON array of ids, not null", lineNo)
		}
		text := tok.Decode(ids)
		if raw {
			out.WriteString(text)
			return out.WriteByte('\n')
		}
		enc := json.NewEncoder(out) // writes the newline
		enc.SetEscapeHTML(false)
		return enc.Encode(text)
	}
	text := line
	if jsonIn {
		var s *string // null leaves it nil, where it left text as the line's own "null"
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			return fmt.Errorf("tokenize: line %d: want a JSON string: %w", lineNo, err)
		}
		if s == nil {
			return fmt.Errorf("tokenize: line %d: want a JSON string, not null", lineNo)
		}
		text = *s
	}
	ids := tok.Encode(text)
	if count {
		out.WriteString(strconv.Itoa(len(ids)))
		return out.WriteByte('\n')
	}
	b := make([]byte, 0, 8*len(ids)+2)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	b = append(b, ']', '\n')
	_, err := out.Write(b)
	return err
}

// renderedJob is a line of `submit tokenize --jobs`: the prompt a worker sends for a job.
type renderedJob struct {
	CustomID     string    `json:"custom_id"`
	PromptTokens []int     `json:"prompt_tokens"`
	Prompt       string    `json:"prompt"`
	Stop         jobs.Stop `json:"stop,omitzero"` // the job's own, else the chat template's
}

// renderJobs reads job lines from stdin and writes, for each, the prompt a worker sends for it
// (worker.PromptTokens) with its text, so that a chat template's output can be read before a
// batch is paid for. Each job's base model finds its tokenizer, as on a worker; baseModel
// stands for the base model of model_path jobs, and the tokenizer at path, if given, serves
// every job. A line that cannot be rendered is named on stderr, and the others go on, as
// submit names every bad line; the error at the end counts them.
func renderJobs(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, baseModel, path string) error {
	var fixed *tokenizer.Tokenizer
	if path != "" {
		var err error
		if fixed, err = tokenizer.Load(path); err != nil {
			return fmt.Errorf("tokenize: %w", err)
		}
	}
	tokens := tokenizer.NewRegistry(tokenizer.OptionsFromEnv(os.Getenv))
	r := jobs.NewReader(stdin, "stdin", jobs.Limits{})
	out := bufio.NewWriterSize(stdout, 1<<16)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	bad, lines := 0, 0
	for {
		if err := ctx.Err(); err != nil {
			out.Flush()
			return fmt.Errorf("tokenize: %w", err)
		}
		j, err := r.Next()
		if err == io.EOF {
			break
		}
		var lineErr *jobs.LineError
		if err != nil && !errors.As(err, &lineErr) {
			out.Flush()
			return fmt.Errorf("tokenize: %w", err)
		}
		lines++
		var rendered renderedJob
		if err == nil {
			rendered, err = renderJob(ctx, j, r.Line(), cmp.Or(j.Model, baseModel), fixed, tokens)
		}
		if err != nil {
			bad++
			out.Flush() // the lines before it first, so that the two streams read in order
			fmt.Fprintf(stderr, "tokenize: %v\n", err)
			continue
		}
		if err := enc.Encode(rendered); err != nil {
			return fmt.Errorf("tokenize: write: %w", err)
		}
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("tokenize: write: %w", err)
	}
	if bad > 0 {
		return fmt.Errorf("tokenize: %d of %d job lines could not be rendered (named above)", bad, lines)
	}
	return nil
}

// renderJob returns the prompt a worker sends for job j, of input line line.
func renderJob(ctx context.Context, j jobs.Job, line int, model string, fixed *tokenizer.Tokenizer, tokens *tokenizer.Registry) (renderedJob, error) {
	if model == "" {
		return renderedJob{}, fmt.Errorf("stdin:%d: job %q names a checkpoint (model_path): give its base model with --model", line, j.CustomID)
	}
	tok := fixed
	if tok == nil {
		var err error
		if tok, err = tokens.ForModel(ctx, model); err != nil {
			return renderedJob{}, fmt.Errorf("stdin:%d: %w", line, err)
		}
	}
	ids, stops, err := worker.PromptTokens(j, model, tok)
	if err != nil {
		return renderedJob{}, fmt.Errorf("stdin:%d: %w", line, err)
	}
	stop := worker.SampleStop(j.Params.Stop, stops, tok) // as the worker sends it
	return renderedJob{CustomID: j.CustomID, PromptTokens: ids, Prompt: tok.Decode(ids), Stop: stop}, nil
}

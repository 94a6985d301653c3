package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
)

const tokenizeUsage = `usage: submit tokenize (--model NAME | --tokenizer PATH) [--count | --decode [--raw]] [--json]

Reads one item per line on stdin and writes one result per line on stdout.
  encode (default)  text line -> JSON array of token ids, e.g. [9707,11,1879]
  --count           text line -> number of tokens
  --decode          JSON array of ids -> JSON string of the text (--raw: the text itself)
Input lines lose their trailing "\n" only; with --json each input line is a JSON
string instead, so texts may hold newlines. Special tokens written in the text
(e.g. <|im_end|>) are encoded as their ids.
--model finds the tokenizer like the Tinker SDK (TINKERFLEET_TOKENIZER_DIR, the
HuggingFace cache under HF_HOME, else a download from HF_ENDPOINT with HF_TOKEN).
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
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("tokenize: unexpected arguments %q", fs.Args())
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
		line, rerr := in.ReadString('\n')
		if rerr != nil && rerr != io.EOF {
			return fmt.Errorf("tokenize: read stdin: %w", rerr)
		}
		if line == "" && rerr == io.EOF {
			break
		}
		line = strings.TrimSuffix(line, "\n")
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
			return fmt.Errorf("tokenize: line %d: want a JSON array of ids: %w", lineNo, err)
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
		if err := json.Unmarshal([]byte(line), &text); err != nil {
			return fmt.Errorf("tokenize: line %d: want a JSON string: %w", lineNo, err)
		}
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

package main

import (
	"context"
	"errors"
	"io"
)

// runTokenize is the `submit tokenize` subcommand (owned by the tokenizer work).
func runTokenize(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	return errors.New("tokenize: not implemented yet")
}

// Command submit validates JSONL prompt files, publishes them as jobs and collects the results.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "submit:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "tokenize" {
		return runTokenize(ctx, args[1:], os.Stdin, os.Stdout, os.Stderr)
	}
	return fmt.Errorf("not implemented yet")
}

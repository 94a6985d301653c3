// Command submit sends JSONL files of prompts to a tinkerfleet and collects the results.
//
//	submit [flags] FILE...         validate, publish one job per line, optionally wait (-o)
//	submit status BATCH            progress of a batch
//	submit results BATCH -o FILE   write the results stored so far (--wait: all of them)
//	submit cancel BATCH            end a batch's remaining jobs as cancelled
//	submit list                    every batch, its results so far and whether it is done
//	submit tokenize ...            tokenize text to size a batch, or show the prompt of each job
//
// Without a NATS URL (or with --local) it runs everything in this process: an embedded
// nats-server with JetStream on disk and a worker, so that one command runs a whole batch:
//
//	go run ./cmd/submit --local --simulate examples/prompts.jsonl -o results.jsonl
//
// --simulate samples on an in-process Tinker simulator; without it, TINKER_API_KEY is used
// against the real service.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/tinkerfleet/tinkerfleet/internal/interrupt"
)

func main() {
	ctx, stop := interrupt.Context(context.Background())
	defer stop()
	env := &environment{getenv: os.Getenv, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, tty: -1}
	if err := run(ctx, os.Args[1:], env); err != nil {
		if ctx.Err() != nil && !errors.Is(err, errInterrupted) { // stopped where it says nothing more useful
			err = fmt.Errorf("%w (%v)", errInterrupted, err)
		}
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "submit:", err)
		}
		os.Exit(exitCode(err))
	}
}

// environment is what the command reads and writes, so tests can run it in-process.
type environment struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// tty forces (1) or forbids (0) the progress bar; -1 asks the terminal.
	tty int
}

func run(ctx context.Context, args []string, env *environment) error {
	if len(args) > 0 {
		switch args[0] {
		case "tokenize":
			return runTokenize(ctx, args[1:], env.stdin, env.stdout, env.stderr)
		case "status":
			return runStatus(ctx, args[1:], env)
		case "results":
			return runResults(ctx, args[1:], env)
		case "failed":
			return runFailed(ctx, args[1:], env)
		case "cancel":
			return runCancel(ctx, args[1:], env)
		case "delete":
			return runDelete(ctx, args[1:], env)
		case "list":
			return runList(ctx, args[1:], env)
		}
	}
	return runSubmit(ctx, args, env)
}

// isSubcommand reports whether name is one of submit's subcommands.
func isSubcommand(name string) bool {
	switch name {
	case "tokenize", "status", "results", "failed", "cancel", "delete", "list":
		return true
	}
	return false
}

// errInvalidInput is returned when validation rejected lines and nothing was published.
var errInvalidInput = errors.New("invalid input")

// errWorkerStopped is returned when submit's in-process worker stopped by itself before the
// batch was done; the error names why, and says how to go on.
var errWorkerStopped = errors.New("the local worker stopped")

// errInterrupted is returned when an interrupt (SIGINT, SIGTERM) stopped a publish or a wait
// for results; its message says how to go on.
var errInterrupted = errors.New("interrupted")

func exitCode(err error) int {
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errInvalidInput):
		return 3
	case errors.Is(err, errInterrupted):
		return 130 // as a shell reports a command ended by SIGINT
	default:
		return 1
	}
}

// plural says n of a thing, in the singular for one: plural(1, "job") is "1 job",
// plural(3, "job") "3 jobs".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// estimate counts what a batch would ask of the Tinker service, per model: jobs, samples,
// prompt tokens (as the worker would send them: chat templates applied, with the same
// tokenizers) and the most tokens it may sample. It is what `submit --dry-run` prints.
type estimate struct {
	tokens *tokenizer.Registry
	models map[string]*modelEstimate
	order  []string // models as they first appear
}

// modelEstimate is the part of an estimate for one model (a base model, or a tinker:// path).
type modelEstimate struct {
	jobs, samples int
	counted       int   // jobs whose prompt tokens are counted
	promptTokens  int64 // over the counted jobs, once per job (its samples share the prompt)
	longest       int
	sampled       int64 // the sum of max_tokens x num_samples over the jobs that set max_tokens
	unbounded     int   // jobs without max_tokens
	notCounted    error // why some prompts are not counted (the first reason)

	tok    *tokenizer.Tokenizer // the model's tokenizer, once found
	tokErr error                // why it was not: asked once, not for every job
}

func newEstimate(tokens *tokenizer.Registry) *estimate {
	return &estimate{tokens: tokens, models: make(map[string]*modelEstimate)}
}

// add counts job j (ctx bounds finding its model's tokenizer).
func (e *estimate) add(ctx context.Context, j jobs.Job) {
	name := j.Model
	if name == "" {
		name = j.ModelPath
	}
	m := e.models[name]
	if m == nil {
		m = &modelEstimate{}
		e.models[name] = m
		e.order = append(e.order, name)
	}
	m.jobs++
	m.samples += j.NumSamples
	if j.Params.MaxTokens != nil {
		m.sampled += int64(*j.Params.MaxTokens) * int64(j.NumSamples)
	} else {
		m.unbounded++
	}
	n, err := e.promptLen(ctx, m, j)
	if err != nil {
		if m.notCounted == nil {
			m.notCounted = err
		}
		return
	}
	m.counted++
	m.promptTokens += int64(n)
	m.longest = max(m.longest, n)
}

// promptLen is the number of prompt tokens of j.
func (e *estimate) promptLen(ctx context.Context, m *modelEstimate, j jobs.Job) (int, error) {
	if len(j.PromptTokens) > 0 {
		return len(j.PromptTokens), nil
	}
	if j.Model == "" {
		return 0, fmt.Errorf("the base model of a tinker:// path is known to the service only")
	}
	if m.tok == nil && m.tokErr == nil {
		if m.tok, m.tokErr = e.tokens.ForModel(ctx, j.Model); m.tokErr != nil {
			m.tokErr = fmt.Errorf("tokenizer: %w", m.tokErr)
		}
	}
	if m.tokErr != nil {
		return 0, m.tokErr
	}
	ids, _, err := worker.PromptTokens(j, j.Model, m.tok)
	return len(ids), err
}

// merge adds o's counts to m's.
func (m *modelEstimate) merge(o *modelEstimate) {
	m.jobs, m.samples, m.counted = m.jobs+o.jobs, m.samples+o.samples, m.counted+o.counted
	m.promptTokens, m.longest = m.promptTokens+o.promptTokens, max(m.longest, o.longest)
	m.sampled, m.unbounded = m.sampled+o.sampled, m.unbounded+o.unbounded
}

// print writes the estimate as a table, with a note for each model whose prompts are not all
// counted or that may sample without a bound.
func (e *estimate) print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tJOBS\tSAMPLES\tPROMPT TOKENS\tLONGEST PROMPT\tSAMPLED TOKENS AT MOST")
	type row struct {
		name string
		m    *modelEstimate
	}
	rows := make([]row, 0, len(e.order)+1)
	var total modelEstimate
	for _, name := range e.order {
		rows = append(rows, row{name, e.models[name]})
		total.merge(e.models[name])
	}
	if len(rows) > 1 {
		rows = append(rows, row{"all models", &total})
	}
	for _, r := range rows {
		name, m := r.name, r.m
		prompt, longest := "-", "-"
		if m.counted > 0 {
			prompt, longest = strconv.FormatInt(m.promptTokens, 10), strconv.Itoa(m.longest)
			if m.counted < m.jobs {
				prompt += fmt.Sprintf(" (%d jobs)", m.counted)
			}
		}
		sampled := strconv.FormatInt(m.sampled, 10)
		if m.unbounded > 0 {
			sampled = "no bound"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", name, m.jobs, m.samples, prompt, longest, sampled)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, name := range e.order {
		m := e.models[name]
		if m.notCounted != nil {
			fmt.Fprintf(w, "%s: prompt tokens not counted for %d of %d jobs: %v\n", name, m.jobs-m.counted, m.jobs, m.notCounted)
		}
		if m.unbounded > 0 {
			fmt.Fprintf(w, "%s: %d of %d jobs set no max_tokens: they sample until a stop token or the end of the model's context\n", name, m.unbounded, m.jobs)
		}
	}
	return nil
}

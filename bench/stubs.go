package main

import (
	"context"
	"errors"
	"io"
)



func runFleet(ctx context.Context, s settings, log io.Writer) (*table, error)  { return nil, errors.New("todo") }
func runSubmit(ctx context.Context, s settings, log io.Writer) (*table, error) { return nil, errors.New("todo") }
func runMemory(ctx context.Context, s settings, log io.Writer) (*table, error) { return nil, errors.New("todo") }

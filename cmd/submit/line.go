package main

import (
	"bufio"
	"errors"
)

// errLineTooLong is readLine's error for a line over its limit.
var errLineTooLong = errors.New("line over its limit")

// readLine returns the next line of in with its "\n", as in.ReadBytes('\n') does: io.EOF
// comes with a last line that has none, or with nothing once none is left. A line of more
// than max bytes before its "\n" is errLineTooLong, read no further than max and a buffer:
// input that has no line end does not take memory without end.
func readLine(in *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		part, err := in.ReadSlice('\n')
		if n := len(line) + len(part); n > max+1 || n == max+1 && part[len(part)-1] != '\n' {
			return nil, errLineTooLong
		}
		line = append(line, part...) // a copy: in reuses its buffer
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// Package corpus builds the text the tokenizer is measured on: a deterministic mix of
// English prose (contractions, numbers, odd spacing, CRLF), other scripts, emoji and marks,
// and Go source from $GOROOT/src/net/http. internal/tokenizer's benchmarks and tests and bench/
// comparison 6 share it, so their figures are about the same bytes.
package corpus

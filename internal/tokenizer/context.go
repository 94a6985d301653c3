package tokenizer

import (
	"errors"
	"fmt"
)

// ErrContextLength is wrapped by CheckContext when a request cannot fit.
var ErrContextLength = errors.New("context length exceeded")

// CheckContext checks that a prompt of promptTokens plus up to maxTokens of
// completion fits in a context window of maxContextLength tokens, the way the
// cookbook caps max_tokens (§10). A maxContextLength <= 0 means unknown and
// passes. The error says by how much the request is over and what max_tokens
// would fit.
func CheckContext(promptTokens, maxTokens, maxContextLength int) error {
	if promptTokens < 0 || maxTokens < 0 {
		return fmt.Errorf("check context: negative token count (prompt %d, max_tokens %d)", promptTokens, maxTokens)
	}
	if maxContextLength <= 0 {
		return nil
	}
	if promptTokens >= maxContextLength {
		return fmt.Errorf("prompt has %d tokens, the model's context window is %d (no room to generate): %w",
			promptTokens, maxContextLength, ErrContextLength)
	}
	if promptTokens+maxTokens > maxContextLength {
		return fmt.Errorf("prompt %d + max_tokens %d = %d tokens exceeds the context window of %d; max_tokens of at most %d would fit: %w",
			promptTokens, maxTokens, promptTokens+maxTokens, maxContextLength, maxContextLength-promptTokens, ErrContextLength)
	}
	return nil
}

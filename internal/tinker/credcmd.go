package tinker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// credentialCmdTimeout bounds one run of the credential command.
const credentialCmdTimeout = 30 * time.Second

// maxCredentialOutput bounds what the credential command may print.
const maxCredentialOutput = 64 << 10

// credentialCmd is TINKER_CREDENTIAL_CMD (§1.1, §2.1): a shell command whose standard output,
// trimmed, is the credential. As in the SDK it runs on every token fetch, never cached: for
// client/config when no API key is set, and for each JWT exchange it is the source of (§2.2).
//
// Neither the command (it may hold a secret, as in "echo tml-…") nor its output appears in
// an error or a log line; its standard error is discarded for the same reason. Its recent
// outputs are kept only to scrub them from error bodies.
type credentialCmd struct {
	cmd string

	mu     sync.Mutex
	recent [2]APIKey // the last two credentials printed, scrubbed from error bodies
}

// fetch runs the command and returns the credential it printed.
func (cc *credentialCmd) fetch(ctx context.Context) (APIKey, error) {
	runCtx, cancel := context.WithTimeout(ctx, credentialCmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, "/bin/sh", "-c", cc.cmd)
	out := &boundedBuffer{limit: maxCredentialOutput}
	cmd.Stdout = out
	cmd.WaitDelay = time.Second // a grandchild holding stdout open does not hang the fetch
	if err := cmd.Run(); err != nil {
		switch {
		case ctx.Err() != nil:
			return "", fmt.Errorf("TINKER_CREDENTIAL_CMD: %w", ctx.Err())
		case runCtx.Err() != nil:
			return "", fmt.Errorf("TINKER_CREDENTIAL_CMD did not finish within %s", credentialCmdTimeout)
		}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return "", fmt.Errorf("TINKER_CREDENTIAL_CMD failed (%s)", exit.ProcessState)
		}
		return "", fmt.Errorf("TINKER_CREDENTIAL_CMD could not run: %w", err)
	}
	if out.over {
		return "", fmt.Errorf("TINKER_CREDENTIAL_CMD printed more than %d bytes", maxCredentialOutput)
	}
	cred := strings.TrimSpace(out.buf.String())
	if cred == "" {
		return "", errors.New("TINKER_CREDENTIAL_CMD printed nothing")
	}
	for i := range len(cred) {
		if c := cred[i]; c <= ' ' || c > '~' {
			return "", fmt.Errorf("TINKER_CREDENTIAL_CMD printed a credential with a character not allowed in the X-API-Key header (at byte %d)", i)
		}
	}
	cc.mu.Lock()
	if cc.recent[0] != APIKey(cred) {
		cc.recent[0], cc.recent[1] = APIKey(cred), cc.recent[0]
	}
	cc.mu.Unlock()
	return APIKey(cred), nil
}

// secrets returns the credentials the command printed last, to scrub from error bodies.
func (cc *credentialCmd) secrets() [2]APIKey {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.recent
}

// boundedBuffer keeps the first limit bytes written to it and notes whether there were more.
// The buffer is a field, not embedded: an embedded bytes.Buffer's ReadFrom would let io.Copy
// (exec's copy of the command's output) go around Write and its bound.
type boundedBuffer struct {
	buf   bytes.Buffer
	limit int
	over  bool
}

// Write keeps what fits and reports all of p written, so that the command is not cut short.
func (b *boundedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := b.limit - b.buf.Len(); n > room {
		b.over = true
		p = p[:max(room, 0)]
	}
	b.buf.Write(p)
	return n, nil
}

package tinker

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// APIKey is a Tinker credential: an API key starting with "tml-" or a JWT starting
// with "eyJ" (§2.1). Every way of printing it (String, GoString, Format, LogValue,
// MarshalText) yields a redacted form, so a key that ends up in a log line, error
// or metric label does not leak. Use string(k) only to build the X-API-Key header.
type APIKey string

const redactedText = "[REDACTED]"

// String returns a redacted form that keeps only the credential kind prefix.
func (k APIKey) String() string {
	switch {
	case k == "":
		return ""
	case strings.HasPrefix(string(k), "tml-"):
		return "tml-" + redactedText
	case strings.HasPrefix(string(k), "eyJ"):
		return "eyJ" + redactedText
	default:
		return redactedText
	}
}

// GoString returns the redacted form for %#v.
func (k APIKey) GoString() string { return fmt.Sprintf("tinker.APIKey(%q)", k.String()) }

// Format makes every fmt verb print the redacted form.
func (k APIKey) Format(f fmt.State, verb rune) {
	switch {
	case verb == 'v' && f.Flag('#'):
		_, _ = io.WriteString(f, k.GoString())
	case verb == 'q':
		_, _ = fmt.Fprintf(f, "%q", k.String())
	default:
		_, _ = io.WriteString(f, k.String())
	}
}

// LogValue makes log/slog print the redacted form.
func (k APIKey) LogValue() slog.Value { return slog.StringValue(k.String()) }

// MarshalText makes encoders (JSON, text) emit the redacted form.
func (k APIKey) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Validate checks the prefix rule of §2.1 without revealing the key.
func (k APIKey) Validate() error {
	s := string(k)
	if s == "" {
		return errors.New("tinker: API key is empty")
	}
	if !strings.HasPrefix(s, "tml-") && !strings.HasPrefix(s, "eyJ") {
		return errors.New("tinker: API key must start with the 'tml-' prefix (or be a JWT starting with 'eyJ')")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			// net/http would refuse it as a header value on every request, which the client
			// retries as a connection error.
			return errors.New("tinker: API key holds a line break or control character (several lines in TINKER_API_KEY_FILE?)")
		}
	}
	return nil
}

// errNoAPIKey says that neither TINKER_API_KEY nor TINKER_API_KEY_FILE is set.
var errNoAPIKey = errors.New("tinker: no API key: set TINKER_API_KEY or TINKER_API_KEY_FILE")

// APIKeyFrom reads the credential from TINKER_API_KEY or, when that is unset or empty, from
// the file named by TINKER_API_KEY_FILE (surrounding white space is trimmed), through getenv
// (os.Getenv, a program's injected environment, tests). The key is validated with
// [APIKey.Validate].
func APIKeyFrom(getenv func(string) string) (APIKey, error) {
	k := APIKey(strings.TrimSpace(getenv("TINKER_API_KEY")))
	if k == "" {
		path := getenv("TINKER_API_KEY_FILE")
		if path == "" {
			return "", errNoAPIKey
		}
		return APIKeyFromFile(path)
	}
	if err := k.Validate(); err != nil {
		return "", err
	}
	return k, nil
}

// APIKeyFileOf returns the file APIKeyFrom reads the key from, through getenv:
// TINKER_API_KEY_FILE when TINKER_API_KEY is unset or empty, else "".
func APIKeyFileOf(getenv func(string) string) string {
	if strings.TrimSpace(getenv("TINKER_API_KEY")) != "" {
		return ""
	}
	return getenv("TINKER_API_KEY_FILE")
}

// maxAPIKeyFile bounds the file read by APIKeyFromFile: a credential is a few hundred bytes
// (a JWT a few kilobytes), and a path set to a large file by mistake is not read whole.
const maxAPIKeyFile = 64 << 10

// APIKeyFromFile reads the credential of TINKER_API_KEY_FILE from path (surrounding white
// space is trimmed) and validates it with [APIKey.Validate].
func APIKeyFromFile(path string) (APIKey, error) {
	f, err := os.Open(path)
	if err != nil {
		// The path is not secret; the content never appears in this error.
		return "", fmt.Errorf("tinker: read TINKER_API_KEY_FILE: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxAPIKeyFile+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("tinker: read TINKER_API_KEY_FILE: %w", err)
	case len(b) > maxAPIKeyFile:
		return "", fmt.Errorf("tinker: TINKER_API_KEY_FILE %s is over %d bytes: not a credential", path, maxAPIKeyFile)
	}
	k := APIKey(strings.TrimSpace(string(b)))
	if err := k.Validate(); err != nil {
		return "", err
	}
	return k, nil
}

// CredentialsFrom reads how to authenticate from the environment, through getenv: the API key
// of [APIKeyFrom], and the credential command TINKER_CREDENTIAL_CMD (§2.1), a shell command
// whose trimmed output is the credential. Either may be missing, not both. The command alone
// serves only a server that exchanges credentials for JWTs (§2.2); Dial says so otherwise.
func CredentialsFrom(getenv func(string) string) (key APIKey, cmd string, err error) {
	cmd = strings.TrimSpace(getenv("TINKER_CREDENTIAL_CMD"))
	key, err = APIKeyFrom(getenv)
	switch {
	case err == nil:
		return key, cmd, nil
	case errors.Is(err, errNoAPIKey) && cmd != "":
		return "", cmd, nil
	case errors.Is(err, errNoAPIKey):
		return "", "", errors.New("tinker: no credentials: set TINKER_API_KEY, TINKER_API_KEY_FILE or TINKER_CREDENTIAL_CMD")
	default:
		return "", "", err
	}
}

package tinker

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
)

// cmdKey is what the test credential commands print: a credential other than testKey.
const cmdKey = "tml-FROMCOMMAND.fedcba9876543210"

// dialErr dials f with mod applied and returns Dial's error (nil: it succeeded).
func dialErr(t *testing.T, f *fakeTinker, mod func(*Config)) error {
	t.Helper()
	cfg := Config{BaseURL: f.url(), Timing: Timing{Clock: newFakeClock(), HeartbeatInterval: time.Hour}}
	mod(&cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err == nil {
		_ = c.Close()
	}
	return err
}

// TestCredentialCmdSources: which requests carry the command's credential (§2.1, §2.2). With
// an API key it serves the exchange only when credential_default_source says
// "credential_cmd"; without one it serves client/config and the exchange.
func TestCredentialCmdSources(t *testing.T) {
	printKey := "printf '%s\\n' " + cmdKey
	t.Run("API key, credential_default_source credential_cmd", func(t *testing.T) {
		f, m := jwtFake(t, hourLife)
		f.set("client/config", jsonReply(200, `{"pjwt_auth_enabled": true, "credential_default_source": "credential_cmd"}`))
		f.setAccept(func(ep, cred string) bool {
			switch ep {
			case "client/config":
				return cred == string(testKey)
			case "auth/token":
				return cred == cmdKey
			}
			return len(m.minted()) > 0 && cred == m.minted()[len(m.minted())-1]
		})
		logs := &fleettest.Buffer{}
		c, _, _ := dial(t, f, func(cfg *Config) { cfg.CredentialCmd = printKey; cfg.Logger = debugLogger(logs) })
		sampler(t, c)
		if len(m.minted()) != 1 || strings.Contains(logs.String(), "level=WARN") {
			t.Fatalf("%d JWTs minted; logs: %s", len(m.minted()), logs.String())
		}
	})
	t.Run("API key, credential_default_source api_key", func(t *testing.T) {
		f, m := jwtFake(t, hourLife) // auth/token takes testKey only
		c, _, _ := dial(t, f, func(cfg *Config) { cfg.CredentialCmd = "exit 1" })
		sampler(t, c)
		if len(m.minted()) != 1 {
			t.Fatal("the API key was not exchanged")
		}
	})
	t.Run("command alone", func(t *testing.T) {
		f, m := jwtFake(t, hourLife)
		f.setAccept(func(ep, cred string) bool {
			if ep == "client/config" || ep == "auth/token" {
				return cred == cmdKey
			}
			return len(m.minted()) > 0 && cred == m.minted()[len(m.minted())-1]
		})
		c, _, _ := dial(t, f, func(cfg *Config) { cfg.APIKey, cfg.CredentialCmd = "", printKey })
		sampler(t, c)
		if len(m.minted()) != 1 || len(f.requests("client/config")) != 1 {
			t.Fatalf("%d JWTs minted, %d client/config", len(m.minted()), len(f.requests("client/config")))
		}
	})
	t.Run("command alone, no JWT exchange", func(t *testing.T) {
		f := newFake(t)
		f.setAccept(func(_, cred string) bool { return cred == cmdKey })
		err := dialErr(t, f, func(cfg *Config) { cfg.CredentialCmd = printKey })
		if err == nil || !strings.Contains(err.Error(), "TINKER_CREDENTIAL_CMD alone is not enough") {
			t.Fatalf("Dial: %v, want the SDK's rule that the command alone needs the JWT exchange", err)
		}
		if strings.Contains(err.Error(), cmdKey) || len(f.requests("create_session")) != 0 {
			t.Fatalf("error %q; %d sessions", err, len(f.requests("create_session")))
		}
	})
}

// TestCredentialCmdFailures: a command that fails, prints nothing, prints too much or prints
// something that cannot be a header value fails Dial with an error that shows neither the
// command (it may hold a secret) nor anything it printed.
func TestCredentialCmdFailures(t *testing.T) {
	const secret = "tml-SECRET.in.the.command"
	for _, tc := range []struct {
		name, cmd, want string
	}{
		{"exit status", "echo " + secret + "; echo " + secret + " >&2; exit 3", "failed (exit status 3)"},
		{"nothing printed", ": " + secret + "; printf '  \\n'", "printed nothing"},
		{"a space inside", "echo tml-a " + secret, "not allowed in the X-API-Key header"},
		{"too much", ": " + secret + "; head -c 100000 /dev/zero | tr '\\0' a", "printed more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			f.set("client/config", jsonReply(200, `{"pjwt_auth_enabled": true}`))
			err := dialErr(t, f, func(cfg *Config) { cfg.CredentialCmd = tc.cmd })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Dial: %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "tml-a") {
				t.Fatalf("the error shows the command or its output: %v", err)
			}
			if n := len(f.requests("")); n != 0 {
				t.Fatalf("%d requests reached the service without a credential", n)
			}
		})
	}
}

// TestCredentialCmdScrubbed: a refusal whose body echoes the command's credential is scrubbed.
func TestCredentialCmdScrubbed(t *testing.T) {
	f := newFake(t)
	f.setAccept(func(string, string) bool { return true })
	f.set("client/config", func(w http.ResponseWriter, r *http.Request, body []byte) {
		jsonReply(403, `{"detail":"key `+r.Header.Get("X-Api-Key")+` is not allowed"}`)(w, r, body)
	})
	err := dialErr(t, f, func(cfg *Config) { cfg.CredentialCmd = "echo " + cmdKey })
	if err == nil || !strings.Contains(err.Error(), "403") || strings.Contains(err.Error(), cmdKey) {
		t.Fatalf("Dial: %v, want a 403 without the credential", err)
	}
}

// TestCredentialsFrom: the environment gives a key, a command or both, and says what to set
// when it gives neither; an unreadable key file is an error even with a command.
func TestCredentialsFrom(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		name    string
		env     map[string]string
		key     APIKey
		cmd     string
		wantErr string
	}{
		{"key", map[string]string{"TINKER_API_KEY": "tml-K"}, "tml-K", "", ""},
		{"command", map[string]string{"TINKER_CREDENTIAL_CMD": " pass show tinker "}, "", "pass show tinker", ""},
		{"both", map[string]string{"TINKER_API_KEY": "tml-K", "TINKER_CREDENTIAL_CMD": "c"}, "tml-K", "c", ""},
		{"neither", map[string]string{}, "", "", "TINKER_CREDENTIAL_CMD"},
		{"unreadable key file", map[string]string{"TINKER_API_KEY_FILE": missing, "TINKER_CREDENTIAL_CMD": "c"}, "", "", "TINKER_API_KEY_FILE"},
		{"bad key", map[string]string{"TINKER_API_KEY": "sk-K", "TINKER_CREDENTIAL_CMD": "c"}, "", "", "tml-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, cmd, err := CredentialsFrom(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || key != tc.key || cmd != tc.cmd {
				t.Fatalf("got %v %q %v, want %v %q", key, cmd, err, tc.key, tc.cmd)
			}
		})
	}
}

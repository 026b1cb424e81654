package oci

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
)

// Credentials authenticate to a registry: a user name and password (or
// access token used as one, as most cloud registries do), or a token.
// They live only as long as the Options that carry them: printing or
// logging them shows which kind is set, never a secret.
type Credentials struct {
	Username string
	Password string
	// IdentityToken is an OAuth2 refresh token, exchanged at the
	// registry's token service for an access token.
	IdentityToken string
	// RegistryToken is a bearer token sent to the registry as is.
	RegistryToken string
}

// String shows which credentials are set, never their secrets.
func (c Credentials) String() string {
	var parts []string
	if c.Username != "" {
		parts = append(parts, "username="+c.Username)
	}
	for _, s := range []struct{ name, v string }{{"password", c.Password}, {"identity-token", c.IdentityToken}, {"registry-token", c.RegistryToken}} {
		if s.v != "" {
			parts = append(parts, s.name+"=[redacted]")
		}
	}
	if len(parts) == 0 {
		return "anonymous"
	}
	return strings.Join(parts, " ")
}

// GoString keeps %#v from printing the fields.
func (c Credentials) GoString() string { return "oci.Credentials{" + c.String() + "}" }

// Format keeps every verb (%v, %+v, %s, %q, ...) on String.
func (c Credentials) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		fmt.Fprint(f, c.GoString())
		return
	}
	fmt.Fprint(f, c.String())
}

// LogValue keeps slog from logging the fields.
func (c Credentials) LogValue() slog.Value { return slog.StringValue(c.String()) }

func (c Credentials) authenticator() authn.Authenticator {
	if c == (Credentials{}) {
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{
		Username:      c.Username,
		Password:      c.Password,
		IdentityToken: c.IdentityToken,
		RegistryToken: c.RegistryToken,
	})
}

// secrets are the strings an error must never show: the secrets as given
// and as they travel (basic auth's base64 of "user:password").
func (c Credentials) secrets() []string {
	var out []string
	for _, s := range []string{c.Password, c.IdentityToken, c.RegistryToken} {
		if s != "" {
			out = append(out, s)
		}
	}
	if c.Password != "" {
		out = append(out, base64.StdEncoding.EncodeToString([]byte(c.Username+":"+c.Password)))
	}
	return out
}

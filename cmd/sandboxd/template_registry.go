package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// The variables that carry a registry's secret for `template build`: a
// secret is never a flag, so that it is never in argv (ps, shell history).
const (
	envRegistryPassword = "SANDBOXD_REGISTRY_PASSWORD"
	envRegistryToken    = "SANDBOXD_REGISTRY_TOKEN"
)

// maxRegistrySecret bounds a secret read from stdin (the server takes at
// most 16 KiB).
const maxRegistrySecret = 16 << 10

// registryFlags are `template build`'s registry credentials: the user
// name is a flag, its password (or a token) comes from stdin or the
// environment.
type registryFlags struct {
	username      string
	passwordStdin bool
	tokenStdin    bool
}

func (r *registryFlags) register(f *pflag.FlagSet) {
	f.StringVar(&r.username, "registry-username", "", "the user for the image's registry; its password (or access token) from --registry-password-stdin or "+envRegistryPassword)
	f.BoolVar(&r.passwordStdin, "registry-password-stdin", false, "read the registry password (or access token) from stdin")
	f.BoolVar(&r.tokenStdin, "registry-token-stdin", false, "read a registry token (sent as a Bearer token, without a user) from stdin; or set "+envRegistryToken)
}

// credentials is the request's registry object, nil for an anonymous
// pull; stdinTaken: another flag reads stdin already.
func (r *registryFlags) credentials(cmd *cobra.Command, stdinTaken bool) (*client.TemplateRegistry, error) {
	fromStdin := r.passwordStdin || r.tokenStdin
	switch {
	case r.passwordStdin && r.tokenStdin:
		return nil, &flagError{flags: []string{"registry-password-stdin", "registry-token-stdin"}, err: fmt.Errorf("--registry-password-stdin and --registry-token-stdin: give a password or a token, not both")}
	case r.passwordStdin && r.username == "":
		return nil, &flagError{flags: []string{"registry-password-stdin"}, err: fmt.Errorf("--registry-password-stdin needs --registry-username")}
	case r.tokenStdin && r.username != "":
		return nil, &flagError{flags: []string{"registry-token-stdin"}, err: fmt.Errorf("--registry-token-stdin is a token alone: not with --registry-username (use --registry-password-stdin for an access token of a user)")}
	case fromStdin && stdinTaken:
		return nil, &flagError{flags: []string{"registry-password-stdin"}, err: fmt.Errorf("stdin is read for the Dockerfile or the steps already: give the registry's secret in %s or %s", envRegistryPassword, envRegistryToken)}
	}
	secret := ""
	if fromStdin {
		b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxRegistrySecret+1))
		if err != nil {
			return nil, fmt.Errorf("read the registry secret from stdin: %w", err)
		}
		if len(b) > maxRegistrySecret {
			return nil, fmt.Errorf("the registry secret on stdin is longer than %d bytes", maxRegistrySecret)
		}
		// As docker login --password-stdin: the line's end is not part of it.
		secret = strings.TrimRight(string(b), "\r\n")
		if secret == "" {
			return nil, fmt.Errorf("stdin holds no registry secret")
		}
	}
	switch {
	case r.username != "":
		if secret == "" {
			secret = os.Getenv(envRegistryPassword)
		}
		if secret == "" {
			return nil, &flagError{flags: []string{"registry-username"}, err: fmt.Errorf("--registry-username needs a password: --registry-password-stdin or %s", envRegistryPassword)}
		}
		u, p := r.username, secret
		return &client.TemplateRegistry{Username: &u, Password: &p}, nil
	case r.tokenStdin:
		return &client.TemplateRegistry{Token: &secret}, nil
	case os.Getenv(envRegistryToken) != "":
		tok := os.Getenv(envRegistryToken)
		return &client.TemplateRegistry{Token: &tok}, nil
	}
	return nil, nil
}

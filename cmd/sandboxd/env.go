package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// One rule for the environment: every flag may also be given as SANDBOXD_
// and its name upper-cased with '-' as '_' (--warm-pool is
// SANDBOXD_WARM_POOL); a flag on the command line wins. A value the flag
// refuses stops the command with an error naming the variable — it never
// falls back to the default silently. A few credentials keep the names
// their own tools read.
var envNames = map[string]string{
	"github-token":            "GITHUB_TOKEN",
	"anthropic-api-key":       "ANTHROPIC_API_KEY",
	"claude-code-oauth-token": "CLAUDE_CODE_OAUTH_TOKEN",
	"key":                     "SANDBOXD_API_KEY",
}

// envName is the environment variable of the flag called name.
func envName(name string) string {
	if n, ok := envNames[name]; ok {
		return n
	}
	return "SANDBOXD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// applyEnv sets each flag of fs that the command line left alone from its
// environment variable (an empty variable counts as unset).
func applyEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok || v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q (for --%s): %w", name, v, f.Name, err))
			return
		}
		f.Changed = true
	})
	return errors.Join(errs...)
}

// withEnv runs applyEnv over the command's flags (its own and those it
// inherits) before next; a command's PersistentPreRunE replaces its
// parents', so every hook is wrapped in it.
func withEnv(next func(*cobra.Command, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := applyEnv(cmd.Flags(), os.LookupEnv); err != nil {
			return err
		}
		if next != nil {
			return next(cmd, args)
		}
		return nil
	}
}

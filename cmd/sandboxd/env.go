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
		if f.Changed || len(f.Annotations[noEnv]) > 0 {
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
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[setByEnv] = []string{name}
	})
	return errors.Join(errs...)
}

// noEnv is the annotation of a flag that no environment variable sets: its
// variable is another command's, of another meaning (SANDBOXD_TEMPLATE is
// the image serve starts sandboxes from, not the template of `sandbox
// create --template`).
const noEnv = "sandboxd/no-env"

// setByEnv is the annotation applyEnv leaves on a flag it set: the
// variable's name.
const setByEnv = "sandboxd/set-by-env"

// flagError is a flag value a command refuses once the flags are parsed
// (a range, a file it names, flags that go together); its message names
// the flags.
type flagError struct {
	flags []string // without "--"
	err   error
}

func (e *flagError) Error() string { return e.err.Error() }
func (e *flagError) Unwrap() error { return e.err }

// flagErrorf is a flagError about flag, whose message the format says.
func flagErrorf(flag, format string, args ...any) error {
	return &flagError{flags: []string{flag}, err: fmt.Errorf(format, args...)}
}

// explainSource adds to a flagError which of its flags were set by an
// environment variable, and by which: the operator must look there, not at
// the command line. Other errors pass unchanged.
func explainSource(fs *pflag.FlagSet, err error) error {
	var fe *flagError
	if !errors.As(err, &fe) {
		return err
	}
	var set []string
	for _, name := range fe.flags {
		if f := fs.Lookup(name); f != nil && len(f.Annotations[setByEnv]) > 0 {
			set = append(set, fmt.Sprintf("--%s is set by %s", name, f.Annotations[setByEnv][0]))
		}
	}
	if len(set) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(set, "; "))
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

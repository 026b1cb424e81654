package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// How the command tree behaves as a whole: unknown subcommands are errors
// with suggestions, help lists only the flags a command uses, and errors
// of a command asked for JSON are JSON.

// usesGlobals is the annotation of a command whose subtree uses only some
// of the root's persistent flags (those of the server's data, logs): a
// space-separated list of their names, "" for none. Help hides the others
// there. A command without it, nor a parent with it, uses them all.
const usesGlobals = "sandboxd/uses-globals"

// finishTree applies the tree's rules to root and every command below it.
func finishTree(root *cobra.Command) {
	defaultHelp := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		defer hideUnusedGlobals(cmd)()
		defaultHelp(cmd, args)
	})
	// A group of commands runs (to refuse unknown ones) but has no usage
	// line of its own: it is used through its commands.
	root.SetUsageTemplate(strings.Replace(root.UsageTemplate(), "Usage:{{if .Runnable}}", "Usage:{{if and .Runnable (not .HasAvailableSubCommands)}}", 1))
	addExamples(root)
	walk(root, func(c *cobra.Command) {
		if c.HasSubCommands() && !c.Runnable() {
			// cobra's own default, which it applies only at the root.
			c.SuggestionsMinimumDistance = 2
			c.Args = unknownSubcommand
			c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		}
	})
}

// walk calls f on c and every command below it.
func walk(c *cobra.Command, f func(*cobra.Command)) {
	f(c)
	for _, sub := range c.Commands() {
		walk(sub, f)
	}
}

// unknownSubcommand refuses the arguments of a command that only groups
// others: cobra would print its help and succeed, so that a typo (`sandbox
// lsit`) or a missing command looked like success to a script.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return fmt.Errorf("%s\n\nRun '%s --help' for its commands", msg, cmd.CommandPath())
}

// hideUnusedGlobals hides, in cmd's help, the root's persistent flags its
// subtree does not use (usesGlobals), and returns what restores them.
func hideUnusedGlobals(cmd *cobra.Command) func() {
	used, ok := globalsUsed(cmd)
	if !ok {
		return func() {}
	}
	var hidden []*pflag.Flag
	cmd.Root().PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && !slices.Contains(used, f.Name) {
			f.Hidden = true
			hidden = append(hidden, f)
		}
	})
	return func() {
		for _, f := range hidden {
			f.Hidden = false
		}
	}
}

// globalsUsed is the usesGlobals of cmd or its nearest parent that has it.
func globalsUsed(cmd *cobra.Command) ([]string, bool) {
	for c := cmd; c != nil; c = c.Parent() {
		if v, ok := c.Annotations[usesGlobals]; ok {
			return strings.Fields(v), true
		}
	}
	return nil, false
}

// annotate adds usesGlobals to cmd and returns it.
func annotate(cmd *cobra.Command, globals ...string) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[usesGlobals] = strings.Join(globals, " ")
	return cmd
}

// wantsJSON says whether cmd was asked for JSON (its --json flag, or
// SANDBOXD_JSON, which a command that failed early has not read yet).
func wantsJSON(cmd *cobra.Command) bool {
	if cmd == nil {
		return false
	}
	f := cmd.Flags().Lookup("json")
	if f == nil {
		return false
	}
	if !f.Changed {
		_ = applyEnv(cmd.Flags(), os.LookupEnv)
	}
	return f.Value.String() == "true"
}

// errorJSON is how a command asked for JSON reports its failure on stderr.
type errorJSON struct {
	Error string `json:"error"`
	// Status is the HTTP status of the API's answer, when there was one.
	Status int `json:"status,omitempty"`
}

// reportError writes err to w: one JSON object when asJSON, else a line.
func reportError(w io.Writer, err error, asJSON bool) {
	if !asJSON {
		fmt.Fprintln(w, "sandboxd:", err)
		return
	}
	out := errorJSON{Error: err.Error()}
	var api *client.Error
	if errors.As(err, &api) {
		out.Status = api.StatusCode
		if api.Body.Error != "" {
			out.Error = api.Body.Error
		}
	}
	b, _ := json.Marshal(out)
	fmt.Fprintf(w, "%s\n", b)
}

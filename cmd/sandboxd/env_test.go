package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestApplyEnv(t *testing.T) {
	env := map[string]string{
		"SANDBOXD_WARM_POOL":       "3",
		"SANDBOXD_SANDBOX_TIMEOUT": "90s",
		"SANDBOXD_NETWORK_DNS":     "10.0.0.53,10.0.0.54",
		"GITHUB_TOKEN":             "t0ken",
		"SANDBOXD_LISTEN":          "127.0.0.1:1",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cmd := newServeCmd(&globals{})
	if err := cmd.Flags().Parse([]string{"--listen", "127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(cmd.Flags(), lookup); err != nil {
		t.Fatal(err)
	}
	get := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
	for name, want := range map[string]string{
		"warm-pool": "3", "sandbox-timeout": "1m30s", "network-dns": "[10.0.0.53,10.0.0.54]",
		"github-token":  "t0ken",
		"listen":        "127.0.0.1:2", // the command line wins
		"node-capacity": "200",         // no variable: the default
	} {
		if got := get(name); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}

	// A value the flag refuses is an error naming the variable, never
	// the default in silence.
	env = map[string]string{"SANDBOXD_WARM_POOL": "two", "SANDBOXD_SANDBOX_TIMEOUT": "soon"}
	err := applyEnv(newServeCmd(&globals{}).Flags(), lookup)
	for _, want := range []string{`SANDBOXD_WARM_POOL="two" (for --warm-pool)`, `SANDBOXD_SANDBOX_TIMEOUT="soon"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad values: %v, want it to name %s", err, want)
		}
	}
}

// TestReadmeDocumentsEveryServeFlag checks the README's configuration table
// against the flags `sandboxd serve` really has, both ways.
func TestReadmeDocumentsEveryServeFlag(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(readme), "## Configuration")
	end := strings.Index(string(readme)[start+1:], "\n## ")
	table := string(readme)[start : start+1+end]
	var documented []string
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		cells := strings.SplitN(line, "|", 4)
		flags := regexp.MustCompile("`--([a-z0-9-]+)`").FindAllStringSubmatch(cells[1], -1)
		envs := regexp.MustCompile("`([A-Z0-9_]+)`").FindAllStringSubmatch(cells[2], -1)
		for i, m := range flags {
			documented = append(documented, m[1])
			// A variable in the Env column is the flag's by the rule.
			if i < len(envs) && envs[i][1] != envName(m[1]) {
				t.Errorf("README gives --%s the variable %s; it is %s", m[1], envs[i][1], envName(m[1]))
			}
		}
	}
	root := newRootCmd()
	var real []string
	add := func(f *pflag.Flag) {
		if f.Name != "help" {
			real = append(real, f.Name)
		}
	}
	newServeCmd(&globals{}).Flags().VisitAll(add)
	root.PersistentFlags().VisitAll(add)
	t.Logf("%d flags, %d documented", len(real), len(documented))
	for _, name := range real {
		if !slices.Contains(documented, name) {
			t.Errorf("--%s is not in README's configuration table", name)
		}
	}
	for _, name := range documented {
		if !slices.Contains(real, name) {
			t.Errorf("README documents --%s, which sandboxd serve does not have", name)
		}
	}
}

package forge

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
)

// TokenEnv is the environment variable of the git process through which
// Push hands the token to the credential helper.
const TokenEnv = "SANDBOXD_FORGE_TOKEN"

// CredentialHelper returns a git credential helper (a value for
// credential.helper) that answers git's "get" with the user x-access-token
// and the password read from the environment variable env when git asks,
// and ignores "store" and "erase", so the secret lives only in the
// environment of the git process. env must be a shell variable name.
// x-access-token is the user name GitHub expects with app installation
// tokens; it accepts any user name with personal access tokens.
//
// It is for git on the host only: the forge's token never enters a sandbox.
func CredentialHelper(env string) string {
	return `!f() { test "$1" = get || exit 0; echo username=x-access-token; echo "password=$` + env + `"; }; f`
}

// Push pushes refspecs from the bare repository at bareRepoPath to
// remoteURL, authenticating with token (which may be empty for a remote
// that needs none). The token travels only in the git process's
// environment (see CredentialHelper); it is not written to disk or to the
// repository's config, it is not in any process's arguments, and it is
// redacted from errors. remoteURL must be https (or http to loopback) and
// must not carry credentials. A ref the remote rejects fails the push with
// an error naming it; the other refs may have landed.
func Push(ctx context.Context, gitBinary, bareRepoPath, remoteURL, token string, refspecs ...string) error {
	_, err := push(ctx, gitBinary, bareRepoPath, remoteURL, token, nil, refspecs)
	return err
}

// refUpdate is one line of `git push --porcelain`.
type refUpdate struct {
	// flag: ' ' fast-forward, '+' forced, '-' deleted, '*' new, '='
	// up to date, '!' rejected.
	flag     byte
	from, to string
	summary  string
}

func (u refUpdate) ok() bool { return u.flag != '!' }

// push runs git push --porcelain with the given leases
// ("--force-with-lease=..." arguments) and returns what happened to each
// ref. The error is non-nil when git failed, including when a ref was
// rejected.
func push(ctx context.Context, git, dir, remote, token string, leases, refspecs []string) ([]refUpdate, error) {
	if err := checkRemote(remote); err != nil {
		return nil, fmt.Errorf("push to %s: %w", redact(remote, token), err)
	}
	if len(refspecs) == 0 {
		return nil, fmt.Errorf("push to %s: no refspecs", redact(remote, token))
	}
	args := []string{"push", "--porcelain", "--no-verify"}
	args = append(args, leases...)
	args = append(args, remote)
	for _, r := range refspecs {
		if strings.HasPrefix(r, "-") {
			return nil, fmt.Errorf("push to %s: refspec %q looks like an option", redact(remote, token), r)
		}
		args = append(args, r)
	}
	stdout, err := runGit(ctx, git, dir, remote, token, args...)
	updates := parsePorcelain(stdout)
	if err != nil {
		var rejected []string
		for _, u := range updates {
			if !u.ok() {
				rejected = append(rejected, u.to+" "+u.summary)
			}
		}
		if len(rejected) > 0 {
			return updates, fmt.Errorf("push to %s: rejected %s: %w", redact(remote, token), strings.Join(rejected, ", "), err)
		}
		return updates, fmt.Errorf("push to %s: %w", redact(remote, token), err)
	}
	return updates, nil
}

// parsePorcelain reads `git push --porcelain` output: "To <url>", then one
// "<flag> TAB <from>:<to> TAB <summary>" line per ref, then "Done".
func parsePorcelain(out []byte) []refUpdate {
	var updates []refUpdate
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if len(line) < 2 || line[1] != '\t' {
			continue
		}
		refs, summary, _ := strings.Cut(line[2:], "\t")
		from, to, ok := strings.Cut(refs, ":")
		if !ok {
			continue
		}
		updates = append(updates, refUpdate{flag: line[0], from: from, to: to, summary: summary})
	}
	return updates
}

// lsRemoteHeads returns the branches of remote: full ref name → commit.
func lsRemoteHeads(ctx context.Context, git, dir, remote, token string) (map[string]string, error) {
	if err := checkRemote(remote); err != nil {
		return nil, fmt.Errorf("list branches of %s: %w", redact(remote, token), err)
	}
	out, err := runGit(ctx, git, dir, remote, token, "ls-remote", "--heads", remote)
	if err != nil {
		return nil, fmt.Errorf("list branches of %s: %w", redact(remote, token), err)
	}
	heads := make(map[string]string)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		sha, ref, ok := strings.Cut(sc.Text(), "\t")
		if ok && strings.HasPrefix(ref, "refs/heads/") {
			heads[ref] = sha
		}
	}
	return heads, nil
}

// passEnv is what git talking to a remote may need from the server's
// environment: the token is the only secret it gets.
var passEnv = []string{
	"PATH", "HOME", "TMPDIR",
	"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy",
	"SSL_CERT_FILE", "SSL_CERT_DIR",
}

// baseGitEnv is the environment of every git command here: only this
// process's configuration counts (no system or user files), never a prompt
// on a terminal, and from the server's environment only passEnv.
func baseGitEnv() []string {
	env := []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=", "LC_ALL=C"}
	for _, k := range passEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// runGit runs git in the repository dir with remote's credentials coming
// from token through the credential helper, and returns its standard
// output. Errors carry git's standard error, redacted.
func runGit(ctx context.Context, git, dir, remote, token string, args ...string) ([]byte, error) {
	if git == "" {
		git = "git"
	}
	env := baseGitEnv()
	cfg := [][2]string{
		// An empty value clears helpers configured before (in the
		// repository's config, say) so that none of them sees the token
		// or stores it.
		{"credential.helper", ""},
	}
	if token != "" {
		env = append(env, TokenEnv+"="+token)
		// Scoped to the remote's origin: should the remote redirect to
		// another host, that host does not get the token.
		cfg = append(cfg, [2]string{"credential." + origin(remote) + ".helper", CredentialHelper(TokenEnv)})
	}
	env = append(env, fmt.Sprintf("GIT_CONFIG_COUNT=%d", len(cfg)))
	for i, kv := range cfg {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, kv[0]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, kv[1]))
	}
	sub := args[0]
	if dir != "" {
		args = append([]string{"--git-dir=" + dir}, args...)
	}
	cmd := exec.CommandContext(ctx, git, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		msg := redact(strings.TrimSpace(stderr.String()), token)
		return stdout.Bytes(), fmt.Errorf("git %s: %w: %s", sub, err, msg)
	}
	return stdout.Bytes(), nil
}

// origin is scheme://host[:port] of a URL, which git matches credential
// configuration against.
func origin(remote string) string {
	u, err := url.Parse(remote)
	if err != nil {
		return remote
	}
	return u.Scheme + "://" + u.Host
}

// isLoopback tells whether host names this machine.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

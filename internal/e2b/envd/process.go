package envd

import (
	"bufio"
	"context"
	"encoding/base64"
	"maps"
	"net/http"
	"os"
	"regexp"
	"strings"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/guest"
	pb "github.com/sandboxd/sandboxd/internal/guest/pb/process"
	"github.com/sandboxd/sandboxd/internal/guest/pb/process/processconnect"
	"github.com/sandboxd/sandboxd/internal/store"
)

// userHeader tells the guest agent which user a request acts as (see
// package guest). The host sets it; a caller's own is removed.
const userHeader = guest.UserHeader

// defaultUser is the user E2B's templates run commands as.
const defaultUser = "user"

// DefaultUserOf is the user a request that names none acts as in sandboxes
// started from the root filesystem rootfs: E2B's "user" when the image has
// one (sandboxd's images all do), or else root, as an image without it
// would run anything.
func DefaultUserOf(rootfs string) string {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return "root"
	}
	defer root.Close()
	f, err := root.Open("etc/passwd")
	if err != nil {
		return "root"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), defaultUser+":") {
			return defaultUser
		}
	}
	return "root"
}

// userName is a user name as the agent accepts it.
var userName = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// requestUser is the user a request to the agent acts as: E2B's SDKs name
// it in Basic authentication ("user:"), or in the username parameter of a
// file link; none is the template's default user, dflt.
func requestUser(r *http.Request, dflt string) (string, bool) {
	name := r.URL.Query().Get("username")
	if authz := r.Header.Get("Authorization"); name == "" && authz != "" {
		scheme, cred, ok := strings.Cut(authz, " ")
		if !ok || !strings.EqualFold(scheme, "Basic") {
			return "", false
		}
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
		if err != nil {
			return "", false
		}
		name, _, _ = strings.Cut(string(b), ":")
	}
	if name == "" {
		return dflt, true
	}
	return name, userName.MatchString(name)
}

// signedUser is the user a signed file link acts as: the username it was
// signed with, or the template's default user, dflt, when that was none.
// Nothing else of the request (its Authorization above all) may change
// it: the signature covers the username, so a link made for "user" must
// not read /etc/shadow as root.
func signedUser(r *http.Request, dflt string) (string, bool) {
	name := r.URL.Query().Get("username")
	if name == "" {
		return dflt, true
	}
	return name, userName.MatchString(name)
}

// startTarget is what a Start call is forwarded with: the sandbox's agent
// and record, and the user it acts as.
type startTarget struct {
	tr   http.RoundTripper
	e    store.E2BSandbox
	user string
	// cwd is where a process that names no directory starts ("": the
	// agent's choice); env is its template's environment (KEY=VALUE).
	cwd string
	env []string
}

type startTargetKey struct{}

// startHandler serves process.Process/Start itself rather than passing
// the bytes on: the sandbox's environment variables (create's envVars)
// go under the request's own, which only a decoded message can do.
func (p *Proxy) startHandler() http.Handler {
	return connect.NewServerStreamHandler(processconnect.ProcessStartProcedure,
		func(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
			t := ctx.Value(startTargetKey{}).(startTarget)
			msg := req.Msg
			if cfg := msg.GetProcess(); cfg != nil && (len(t.e.EnvVars) > 0 || len(t.env) > 0) {
				// The template's, under the create's, under the
				// request's own.
				envs := map[string]string{}
				for _, kv := range t.env {
					if k, v, ok := strings.Cut(kv, "="); ok {
						envs[k] = v
					}
				}
				maps.Copy(envs, t.e.EnvVars)
				maps.Copy(envs, cfg.GetEnvs())
				cfg.Envs = envs
			}
			if cfg := msg.GetProcess(); cfg != nil && cfg.GetCwd() == "" && t.cwd != "" {
				cfg.Cwd = &t.cwd
			}
			client := processconnect.NewProcessClient(&http.Client{Transport: t.tr}, "http://agent")
			out := connect.NewRequest(msg)
			out.Header().Set(userHeader, t.user)
			in, err := client.Start(ctx, out)
			if err != nil {
				return err
			}
			defer in.Close()
			for in.Receive() {
				if err := stream.Send(in.Msg()); err != nil {
					return err
				}
			}
			err = in.Err()
			if err != nil && !connect.IsWireError(err) && ctx.Err() == nil {
				// The way to the agent broke (the sandbox was killed or
				// died), not an answer of the agent's: the caller's
				// connection is cut, as envd's is when its sandbox goes,
				// so the SDK asks /health and says the sandbox was killed
				// rather than reporting a protocol error.
				panic(http.ErrAbortHandler)
			}
			return err
		})
}

package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// envName is an environment variable's name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// newSandboxRequest is NewSandbox and NewSandboxV2.
type newSandboxRequest struct {
	TemplateID      string            `json:"templateID"`
	Timeout         *int64            `json:"timeout"` // seconds
	Metadata        map[string]string `json:"metadata"`
	EnvVars         map[string]string `json:"envVars"`
	Secure          *bool             `json:"secure"`
	AutoPause       *bool             `json:"autoPause"`
	AutoPauseMemory *bool             `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled *bool `json:"enabled"`
	} `json:"autoResume"`
	AllowInternetAccess *bool          `json:"allow_internet_access"`
	Network             *networkConfig `json:"network"`
	// VolumeMounts is E2B's SandboxVolumeMount[] (parseVolumeMounts).
	VolumeMounts json.RawMessage `json:"volumeMounts"`
}

// networkConfig is the part of E2B's SandboxNetworkConfig sandboxd's
// policy expresses.
type networkConfig struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
	// AllowPublicTraffic false puts the sandbox's ports behind a traffic
	// token (create only).
	AllowPublicTraffic *bool `json:"allowPublicTraffic"`
}

// sandboxResponse is E2B's Sandbox: what create, resume and connect answer.
type sandboxResponse struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias,omitempty"`
}

// clientID is a fixed value: E2B's is an internal routing detail that the
// SDKs carry but do not use.
const clientID = "sandboxd"

func (a *API) create(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	var req newSandboxRequest
	raw, err := decodeRaw(r, &req)
	if err != nil {
		return err
	}
	if err := refuseUnsupported(raw); err != nil {
		return err
	}
	if req.TemplateID == "" {
		req.TemplateID = DefaultTemplate
	}
	// A custom template of that name (the account's, else a public one)
	// before the built-in ids, which all start the server's image.
	custom, err := a.customTemplate(r.Context(), c, req.TemplateID)
	if err != nil {
		return err
	}
	if custom == "" && req.TemplateID != DefaultTemplate && !slices.Contains(a.opts.Templates, req.TemplateID) {
		starts := slices.Compact(slices.Sorted(slices.Values(append([]string{DefaultTemplate}, a.opts.Templates...))))
		hint := ""
		if req.TemplateID == CodeInterpreterTemplate {
			hint = "; the code interpreter needs an image with Jupyter's kernels: start sandboxd serve with --template code-interpreter"
		}
		return edge.Errorf(http.StatusNotFound, "template %q not found: this server starts %s and the templates of GET /templates%s", req.TemplateID, strings.Join(starts, ", "), hint)
	}
	if len(req.EnvVars) > 256 {
		return edge.Errorf(http.StatusBadRequest, "envVars: at most 256 variables")
	}
	for k, v := range req.EnvVars {
		if !envName.MatchString(k) || len(v) > 32<<10 {
			return edge.Errorf(http.StatusBadRequest, "envVars: %q: names are letters, digits and _, not starting with a digit; values at most 32 KiB", k)
		}
	}
	for k, v := range req.Metadata {
		if len(k) == 0 || len(k) > 256 || len(v) > 4096 {
			return edge.Errorf(http.StatusBadRequest, "metadata: keys of 1 to 256 bytes and values of at most 4096 bytes")
		}
	}
	if len(req.Metadata) > 64 {
		return edge.Errorf(http.StatusBadRequest, "metadata: at most 64 entries")
	}
	mounts, err := parseVolumeMounts(req.VolumeMounts)
	if err != nil {
		return err
	}
	creq := sandbox.CreateRequest{Template: custom, Volumes: mounts}
	keepMemory := req.AutoPauseMemory == nil || *req.AutoPauseMemory
	if req.AutoPause != nil && *req.AutoPause {
		creq.OnTimeout = store.OnTimeoutPause
		if !keepMemory {
			// onTimeout {action: 'pause', keepMemory: false}: its
			// files alone, resumed by connect on any node.
			creq.OnTimeout = store.OnTimeoutPauseFiles
		}
	} else if !keepMemory {
		return edge.Errorf(http.StatusBadRequest, "autoPauseMemory: only with autoPause (onTimeout: 'pause')")
	}
	autoResume := req.AutoResume != nil && req.AutoResume.Enabled != nil && *req.AutoResume.Enabled
	if autoResume && creq.OnTimeout == "" {
		return edge.Errorf(http.StatusBadRequest, "autoResume: only with autoPause (onTimeout: 'pause'): a sandbox killed at its timeout has nothing to resume")
	}
	if autoResume && !keepMemory {
		return edge.Errorf(http.StatusBadRequest, "autoResume: not with autoPauseMemory false (keepMemory: false): a sandbox paused with its files alone starts its processes afresh, so it is resumed by connect, not by traffic")
	}
	if req.Timeout != nil {
		if creq.Lifetime, err = a.seconds("timeout", *req.Timeout); err != nil {
			return err
		}
	}
	policy, err := req.policy()
	if err != nil {
		return err
	}
	creq.Network = policy
	// Placed like every front end's creates: best of K healthy nodes.
	node, local, err := a.gate.Place(r.Context(), c, policy)
	if err != nil {
		return err
	}
	if !local {
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(raw)), int64(len(raw))
		a.gate.Forward(w, r, c, node, true)
		return nil
	}
	token, err := newAccessToken()
	if err != nil {
		return err
	}
	sb, _, err := a.opts.Sandboxes.Create(r.Context(), c.AccountID, creq)
	if err != nil {
		return err
	}
	e := store.E2BSandbox{SandboxID: sb.ID, AccountID: c.AccountID, TemplateID: req.TemplateID, Metadata: req.Metadata, EnvVars: req.EnvVars, AccessToken: token, AutoResume: autoResume, CreatedAt: a.opts.Now()}
	if req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic {
		if e.TrafficToken, err = newAccessToken(); err != nil {
			return err
		}
	}
	if err := a.opts.Store.CreateE2BSandbox(context.WithoutCancel(r.Context()), e); err != nil {
		// Without its record the sandbox cannot be reached through this API.
		_, _ = a.opts.Sandboxes.Stop(context.WithoutCancel(r.Context()), c.Principal, sb.ID)
		return err
	}
	if req.TemplateID == CodeInterpreterTemplate {
		// The code-interpreter SDK runs code next: its kernel starts now.
		go func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Minute)
			defer cancel()
			a.envd.WarmCode(ctx, e)
		}()
	}
	writeJSON(w, http.StatusCreated, a.sandboxResponse(e))
	return nil
}

// policy maps E2B's network options onto sandboxd's policy: no options is
// the server's default, allow_internet_access false is no network, and
// allowOut lists what may be reached. denyOut is refused: sandboxd's deny
// list is the operator's, always applied, and a policy is an allow list.
func (req newSandboxRequest) policy() (*netpol.Policy, error) {
	return policyOf(req.AllowInternetAccess, req.Network)
}

// policyOf maps E2B's network options onto a policy; nil when they say
// nothing.
func policyOf(allowInternet *bool, n *networkConfig) (*netpol.Policy, error) {
	if n != nil && len(n.DenyOut) > 0 {
		return nil, edge.Errorf(http.StatusBadRequest, "network.denyOut is not supported: sandboxd's policies are allow lists (network.allowOut), and private, host and metadata addresses are always denied")
	}
	if allowInternet != nil && !*allowInternet {
		if n != nil && len(n.AllowOut) > 0 {
			return nil, edge.Errorf(http.StatusBadRequest, "allow_internet_access false with network.allowOut: choose one")
		}
		p := netpol.Policy{Mode: netpol.ModeNone}
		return &p, nil
	}
	if n != nil && len(n.AllowOut) > 0 {
		p := netpol.Policy{Mode: netpol.ModeAllow, Allow: n.AllowOut}
		if err := p.Validate(); err != nil {
			var pe *netpol.PolicyError
			if errors.As(err, &pe) {
				return nil, edge.Errorf(http.StatusBadRequest, "network.allowOut: %s", pe.Msg)
			}
			return nil, err
		}
		return &p, nil
	}
	if allowInternet != nil && *allowInternet {
		p := netpol.Policy{Mode: netpol.ModeEgress}
		return &p, nil
	}
	return nil, nil
}

// newAccessToken returns a sandbox's envd access token: 32 random bytes.
func newAccessToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate access token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

func (a *API) sandboxResponse(e store.E2BSandbox) sandboxResponse {
	r := sandboxResponse{SandboxID: envd.E2BID(e.SandboxID), TemplateID: e.TemplateID, ClientID: clientID, EnvdVersion: EnvdVersion, EnvdAccessToken: e.AccessToken}
	if a.opts.Domain != "" {
		r.Domain = &a.opts.Domain
	}
	if e.TrafficToken != "" {
		r.TrafficAccessToken = &e.TrafficToken
	}
	return r
}

// refuseUnsupported answers 400 naming each option of E2B's create that
// sandboxd does not implement when the body asks for it, instead of
// accepting and ignoring it. The SDKs send these only when a program sets
// them, so a program that does not gets no refusal; a value that asks for
// nothing (an empty list, null) is no request.
func refuseUnsupported(raw []byte) error {
	var top map[string]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &top) != nil {
		return nil // decodeRaw answered for a body that is not an object
	}
	var refused []string
	for _, o := range []struct{ name, why string }{
		{"mcp", "E2B's MCP gateway in the sandbox is not served"},
		{"iam", "E2B's IAM token transforms are not served"},
	} {
		if asks(top[o.name]) {
			refused = append(refused, o.name+" ("+o.why+")")
		}
	}
	var network map[string]json.RawMessage
	if asks(top["network"]) && json.Unmarshal(top["network"], &network) == nil {
		for _, o := range []struct{ name, why string }{
			{"rules", "sandboxd's network policy is an allow list of destinations"},
			{"egressProxy", "sandboxd's sandboxes reach out through its own proxy"},
			{"maskRequestHost", "the Host header reaches a sandbox's port as sent"},
			{"httpsPorts", "a sandbox's ports are served as they answer"},
		} {
			if asks(network[o.name]) {
				refused = append(refused, "network."+o.name+" ("+o.why+")")
			}
		}
	}
	if len(refused) > 0 {
		return edge.Errorf(http.StatusBadRequest, "not supported by sandboxd: %s", strings.Join(refused, "; "))
	}
	return nil
}

// asks reports whether an option's JSON value asks for anything: not
// absent, null, false, "", [] or {}.
func asks(v json.RawMessage) bool {
	switch strings.TrimSpace(string(v)) {
	case "", "null", "false", `""`, "[]", "{}":
		return false
	}
	return true
}

package e2b

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// listLimit bounds one page of a list.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

// listedSandbox is E2B's ListedSandbox; sandboxDetail adds to it.
type listedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

type sandboxDetail struct {
	listedSandbox
	// EnvdAccessToken is given to account keys only: with it, anyone runs
	// commands in the sandbox as root.
	EnvdAccessToken string    `json:"envdAccessToken,omitempty"`
	Domain          *string   `json:"domain"`
	Lifecycle       lifecycle `json:"lifecycle"`
	// AllowInternetAccess and Network are its network as E2B's options
	// say it (getInfo's network).
	AllowInternetAccess *bool          `json:"allowInternetAccess,omitempty"`
	Network             *networkDetail `json:"network,omitempty"`
	// VolumeMounts are the volumes it mounts (E2B's SandboxVolumeMount).
	VolumeMounts []volumeMount `json:"volumeMounts"`
}

// networkDetail is E2B's SandboxNetworkConfig as sandboxd answers it: the
// allow list (a CIDR of everything for egress, none for no network), and
// whether its ports take traffic without a token.
type networkDetail struct {
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
}

// networkOf is sb's network in E2B's terms.
func networkOf(sb store.Sandbox, e store.E2BSandbox) (*bool, *networkDetail) {
	var p netpol.Policy
	if sb.Network == "" || json.Unmarshal([]byte(sb.Network), &p) != nil {
		return nil, nil
	}
	n := &networkDetail{AllowOut: []string{}, DenyOut: []string{}, AllowPublicTraffic: e.TrafficToken == ""}
	var internet *bool
	switch p.Mode {
	case netpol.ModeEgress:
		n.AllowOut = []string{"0.0.0.0/0"}
		internet = new(true)
	case netpol.ModeAllow:
		n.AllowOut = append(n.AllowOut, p.Allow...)
	default:
		internet = new(false)
	}
	return internet, n
}

// lifecycle is E2B's SandboxLifecycle: what the timeout does.
type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"` // "kill" or "pause"
}

func lifecycleOf(sb store.Sandbox, e store.E2BSandbox) lifecycle {
	if sb.OnTimeout == store.OnTimeoutPause || sb.OnTimeout == store.OnTimeoutPauseFiles {
		return lifecycle{OnTimeout: "pause", AutoResume: e.AutoResume}
	}
	return lifecycle{OnTimeout: "kill"}
}

// state is E2B's name for where a live sandbox is.
func state(sb store.Sandbox) string {
	if sb.Pause != "" {
		return "paused"
	}
	return "running"
}

func (a *API) listed(sb store.Sandbox, e store.E2BSandbox) listedSandbox {
	meta := e.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	end := sb.Deadline
	if sb.Pause != "" {
		end = a.opts.Now().Add(sb.PausedRemaining)
	}
	return listedSandbox{
		SandboxID: envd.E2BID(sb.ID), TemplateID: e.TemplateID, ClientID: clientID,
		StartedAt: sb.CreatedAt.UTC(), EndAt: end.UTC(),
		CPUCount: a.opts.CPUs, MemoryMB: a.opts.MemoryMB, DiskSizeMB: a.opts.DiskMB,
		Metadata: meta, State: state(sb), EnvdVersion: EnvdVersion,
	}
}

func (a *API) get(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	sb, e, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	d := sandboxDetail{listedSandbox: a.listed(sb, e), Lifecycle: lifecycleOf(sb, e)}
	d.AllowInternetAccess, d.Network = networkOf(sb, e)
	if d.VolumeMounts, err = a.sandboxVolumeMounts(r.Context(), sb.ID); err != nil {
		return err
	}
	if c.Scope() == auth.ScopeFull {
		// A sandbox's key reads, never acts: the token would let it run
		// commands as root in this sandbox, whatever its own scope says.
		d.EnvdAccessToken = e.AccessToken
	}
	if a.opts.Domain != "" {
		d.Domain = &a.opts.Domain
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

// list answers both GET /sandboxes (v1: running ones, filtered by
// metadata) and GET /v2/sandboxes (state, metadata, template,
// startedAfter, order, limit and nextToken; the next page's token in the
// X-Next-Token header, and, when running sandboxes were asked for, how
// many match in all in X-Total-Running). It reads the account's live
// sandboxes from the store, which selects them by their status: an
// account's ended sandboxes, however many, never push a live one out of
// the list. A token is the place of the last sandbox of a page
// (store.Cursor): pages neither repeat nor skip a sandbox when others
// start or end between two requests.
func (a *API) list(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	q := r.URL.Query()
	v2 := strings.HasPrefix(r.URL.Path, "/v2/")
	var f listFilter
	var err error
	if f.meta, err = metadataFilter(q.Get("metadata")); err != nil {
		return err
	}
	f.states = map[string]bool{"running": true, "paused": v2}
	if s := q.Get("state"); s != "" {
		f.states = map[string]bool{}
		for _, st := range strings.Split(s, ",") {
			if st != "running" && st != "paused" {
				return edge.Errorf(http.StatusBadRequest, "state %q: want running or paused", st)
			}
			f.states[st] = true
		}
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		f.page.Ascending = true
	default:
		return edge.Errorf(http.StatusBadRequest, "order %q: want asc or desc", q.Get("order"))
	}
	if s := q.Get("startedAfter"); s != "" {
		if f.page.StartedAfter, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return edge.Errorf(http.StatusBadRequest, "startedAfter %q: want a date-time (RFC 3339)", s)
		}
	}
	if t := q.Get("template"); t != "" {
		f.template = &t
		if f.custom, err = a.customTemplate(r.Context(), c, t); err != nil {
			return err
		}
	}
	limit := defaultListLimit
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > maxListLimit {
			return edge.Errorf(http.StatusBadRequest, "limit must be 1 to %d", maxListLimit)
		}
	}
	if s := q.Get("nextToken"); s != "" {
		if f.page.After, err = store.ParseCursor(s); err != nil {
			return edge.Errorf(http.StatusBadRequest, "nextToken is not one this server gave")
		}
	}
	most := 0 // v1 lists them all
	if v2 {
		most = limit + 1 // one more than a page says whether another follows
		if f.states["running"] {
			// The running ones that match, before paging: the first
			// page's cursor, every one of them.
			all := f
			all.page.After, all.states = store.Cursor{}, map[string]bool{"running": true}
			running, err := a.liveSandboxes(r.Context(), c.AccountID, all, 0)
			if err != nil {
				return err
			}
			w.Header().Set("X-Total-Running", strconv.Itoa(len(running)))
		}
	}
	found, err := a.liveSandboxes(r.Context(), c.AccountID, f, most)
	if err != nil {
		return err
	}
	if v2 && len(found) > limit {
		found = found[:limit]
		w.Header().Set("X-Next-Token", found[limit-1].e.Cursor().String())
	}
	page := make([]listedSandbox, len(found))
	for i, f := range found {
		page[i] = a.listed(f.sb, f.e)
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// listFilter is what a list asks for.
type listFilter struct {
	page   store.E2BPage // from where, in which order, since when
	meta   map[string]string
	states map[string]bool
	// template, when set, is the template asked for (an id or alias);
	// custom is the custom template it names ("": a built-in one).
	template *string
	custom   string
}

// ofTemplate says whether a sandbox was made from f's template: the same
// custom template however it was named, or the built-in of that name.
func (f listFilter) ofTemplate(sb store.Sandbox, e store.E2BSandbox) bool {
	switch {
	case f.template == nil:
		return true
	case f.custom != "":
		return sb.TemplateID == f.custom
	default:
		return sb.TemplateID == "" && e.TemplateID == *f.template
	}
}

// listBatch is how many live sandboxes list reads from the store at once.
const listBatch = 200

// liveSandbox is a sandbox list shows, with its E2B record.
type liveSandbox struct {
	sb store.Sandbox
	e  store.E2BSandbox
}

// liveSandboxes returns the live sandboxes of accountID that f selects, in
// its order from its cursor on: at most most of them (0: all).
func (a *API) liveSandboxes(ctx context.Context, accountID string, f listFilter, most int) ([]liveSandbox, error) {
	var out []liveSandbox
	page := f.page
	page.Limit = listBatch
	for {
		records, err := a.opts.Store.ListLiveE2BSandboxes(ctx, accountID, page)
		if err != nil {
			return nil, err
		}
		if len(records) == 0 {
			return out, nil
		}
		last := len(records) < listBatch
		page.After = records[len(records)-1].Cursor()
		records = slices.DeleteFunc(records, func(e store.E2BSandbox) bool { return !matches(e.Metadata, f.meta) })
		ids := make([]string, len(records))
		for i, e := range records {
			ids[i] = e.SandboxID
		}
		rows, err := a.opts.Store.ListSandboxesByID(ctx, ids)
		if err != nil {
			return nil, err
		}
		byID := make(map[string]store.Sandbox, len(rows))
		for _, sb := range a.opts.Sandboxes.Live(ctx, rows) {
			byID[sb.ID] = sb
		}
		for _, e := range records { // in the page's order
			sb, ok := byID[e.SandboxID]
			if !ok || !live(sb) || !f.states[state(sb)] || !f.ofTemplate(sb, e) {
				continue // ended (or gone) meanwhile, or another state or template
			}
			out = append(out, liveSandbox{sb: sb, e: e})
			if most > 0 && len(out) == most {
				return out, nil
			}
		}
		if last {
			return out, nil
		}
	}
}

// metadataFilter parses the SDKs' metadata query: a URL-encoded query
// string of key=value pairs, each part encoded once more.
func metadataFilter(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(s)
	if err != nil {
		return nil, edge.Errorf(http.StatusBadRequest, "metadata filter: %v", err)
	}
	out := make(map[string]string, len(vals))
	for k, vs := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(vs[len(vs)-1])
		if err1 != nil || err2 != nil {
			return nil, edge.Errorf(http.StatusBadRequest, "metadata filter: bad encoding")
		}
		out[key] = val
	}
	return out, nil
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

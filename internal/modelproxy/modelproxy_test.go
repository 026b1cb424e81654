package modelproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

const (
	realAnthropicKey = "sk-ant-real-operator-key"
	realOpenAIKey    = "sk-real-openai-operator-key"
)

// seen is what the fake upstream received.
type seen struct {
	path, query, apiKey, authz, cookie, body string
}

// fakeProvider is a fake at a boundary we do not own (the model providers'
// APIs): it records what reached it, answers JSON with usage, or streams
// Server-Sent Events when asked to.
func fakeProvider(t *testing.T, got chan<- seen) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.URL.Path, r.URL.RawQuery, r.Header.Get("X-Api-Key"), r.Header.Get("Authorization"), r.Header.Get("Cookie"), string(b)}
		if strings.Contains(string(b), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "event: delta\ndata: {\"i\":%d}\n\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(50 * time.Millisecond)
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=provider")
		fmt.Fprint(w, `{"id":"msg_1","usage":{"input_tokens":12,"output_tokens":34}}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

type fixture struct {
	proxy   *httptest.Server
	reg     *prometheus.Registry
	got     chan seen
	account string
	sbKey   string // a live sandbox key
	revoked string // the key of a sandbox that ended
	foreign string // an account key (not a sandbox's)
}

func newFixture(t *testing.T, maxBody int64) *fixture {
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	acct := store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &acct); err != nil {
		t.Fatal(err)
	}
	key := func(sandboxID string) string {
		plaintext, prefix, hash, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		if sandboxID != "" {
			sb := store.Sandbox{ID: sandboxID, AccountID: acct.ID, NodeID: "n", Status: store.SandboxRunning, Runtime: "gvisor", Deadline: time.Now().Add(time.Hour)}
			if err := st.CreateSandbox(ctx, &sb); err != nil {
				t.Fatal(err)
			}
		}
		k := store.APIKey{AccountID: acct.ID, Prefix: prefix, Hash: hash, SandboxID: sandboxID}
		if err := st.CreateAPIKey(ctx, &k); err != nil {
			t.Fatal(err)
		}
		return plaintext
	}
	f := &fixture{reg: prometheus.NewRegistry(), got: make(chan seen, 8), account: acct.ID}
	f.sbKey, f.revoked, f.foreign = key("sbx_live"), key("sbx_gone"), key("")
	if err := st.RevokeSandboxKeys(ctx, "sbx_gone", time.Now()); err != nil {
		t.Fatal(err)
	}
	up := fakeProvider(t, f.got)
	p, err := New(Options{
		Auth: auth.NewAuthenticator(st),
		Upstreams: map[string]Upstream{
			Anthropic: {BaseURL: up.URL, APIKey: realAnthropicKey},
			OpenAI:    {BaseURL: up.URL + "/api/v1", APIKey: realOpenAIKey},
		},
		MaxBody: maxBody, Registry: f.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.proxy = httptest.NewServer(p)
	t.Cleanup(f.proxy.Close)
	return f
}

func (f *fixture) do(t *testing.T, path string, headers map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", f.proxy.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestProxyAddsTheRealKeyOutsideTheSandbox(t *testing.T) {
	securitytest.Attack(t, "secrets",
		"code in a sandbox calls the model API through sandboxd.internal with its own key, and with a revoked, an account or no key, hoping to see or use the operator's model key",
		"the provider receives the operator's key only from the proxy; the sandbox's key never reaches it and no answer carries the real key; revoked keys are 401, account keys 403")
	f := newFixture(t, 0)

	cases := []struct {
		name, path string
		headers    map[string]string
		status     int
		wantPath   string
		wantAPIKey string
		wantAuthz  string
	}{
		{"anthropic with x-api-key", "/model/anthropic/v1/messages?beta=true", map[string]string{"x-api-key": f.sbKey, "Cookie": "a=b"}, 200, "/v1/messages", realAnthropicKey, ""},
		{"openai with bearer", "/model/openai/chat/completions", map[string]string{"Authorization": "Bearer " + f.sbKey}, 200, "/api/v1/chat/completions", "", "Bearer " + realOpenAIKey},
		{"both headers, same key", "/model/anthropic/v1/messages", map[string]string{"x-api-key": f.sbKey, "Authorization": "Bearer " + f.sbKey}, 200, "/v1/messages", realAnthropicKey, ""},
		{"both headers, different keys", "/model/anthropic/v1/messages", map[string]string{"x-api-key": f.sbKey, "Authorization": "Bearer " + f.foreign}, 401, "", "", ""},
		{"revoked sandbox key", "/model/anthropic/v1/messages", map[string]string{"x-api-key": f.revoked}, 401, "", "", ""},
		{"unknown key", "/model/anthropic/v1/messages", map[string]string{"x-api-key": "sbx_nope"}, 401, "", "", ""},
		{"no key", "/model/anthropic/v1/messages", nil, 401, "", "", ""},
		{"account key, not a sandbox's", "/model/anthropic/v1/messages", map[string]string{"x-api-key": f.foreign}, 403, "", "", ""},
		{"the operator's own key is not a sandbox key", "/model/anthropic/v1/messages", map[string]string{"x-api-key": realAnthropicKey}, 401, "", "", ""},
		{"path climbing out of the base", "/model/openai/..%2f..%2fadmin", map[string]string{"x-api-key": f.sbKey}, 400, "", "", ""},
		{"unknown provider", "/model/other/v1", map[string]string{"x-api-key": f.sbKey}, 404, "", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.do(t, tc.path, tc.headers, `{"model":"m"}`)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if strings.Contains(body, realAnthropicKey) || strings.Contains(body, realOpenAIKey) || resp.Header.Get("Set-Cookie") != "" {
				t.Fatalf("the answer carries a secret: %v %s", resp.Header, body)
			}
			if tc.status != 200 {
				select {
				case s := <-f.got:
					t.Fatalf("a refused request reached the provider: %+v", s)
				default:
				}
				return
			}
			s := <-f.got
			if s.path != tc.wantPath || s.apiKey != tc.wantAPIKey || s.authz != tc.wantAuthz || s.cookie != "" || s.body != `{"model":"m"}` {
				t.Fatalf("provider saw %+v", s)
			}
			if strings.Contains(fmt.Sprint(s), f.sbKey) {
				t.Fatal("the sandbox's key reached the provider")
			}
		})
	}
	if n := f.proxyRequests(t, "anthropic", "200"); n != 2 {
		t.Fatalf("metered %v anthropic requests", n)
	}
	if n := f.counter(t, "sandboxd_model_tokens_total", "output"); n != 34*2 {
		t.Fatalf("metered %v output tokens", n)
	}
}

func TestProxyStreamsAndBoundsBodies(t *testing.T) {
	securitytest.Attack(t, "secrets",
		"code in a sandbox sends the model proxy a request body larger than its limit",
		"the proxy answers 413 without forwarding it; streamed answers still pass through chunk by chunk")
	f := newFixture(t, 1024)

	req, _ := http.NewRequest("POST", f.proxy.URL+"/model/anthropic/v1/messages", strings.NewReader(`{"stream":true}`))
	req.Header.Set("x-api-key", f.sbKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, ct)
	}
	// The first event arrives before the provider has finished.
	start := time.Now()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "event: delta\n" || time.Since(start) > 90*time.Millisecond {
		t.Fatalf("first line %q %v after %v", line, err, time.Since(start))
	}
	<-f.got

	for _, chunked := range []bool{false, true} {
		body := io.Reader(strings.NewReader(strings.Repeat("x", 4096)))
		if chunked {
			body = io.MultiReader(body) // no length known: read until the limit
		}
		req, _ := http.NewRequest("POST", f.proxy.URL+"/model/anthropic/v1/messages", body)
		req.Header.Set("x-api-key", f.sbKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("chunked=%v: %d %s", chunked, resp.StatusCode, b)
		}
	}
	select {
	case s := <-f.got:
		if len(s.body) > 1024 {
			t.Fatalf("the provider got %d bytes", len(s.body))
		}
	default:
	}
}

func (f *fixture) proxyRequests(t *testing.T, provider, status string) float64 {
	return f.counterVec(t, "sandboxd_model_requests_total", map[string]string{"account": f.account, "provider": provider, "status": status})
}

func (f *fixture) counter(t *testing.T, name, kind string) float64 {
	return f.counterVec(t, name, map[string]string{"account": f.account, "provider": "anthropic", "kind": kind})
}

// counterVec finds one series in the registry.
func (f *fixture) counterVec(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s %v", name, labels)
	return 0
}

package modelproxy

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
	method, path, query, apiKey, authz, cookie, body string
}

// report is the usage the fake provider reports for each answer.
type report struct {
	input, cacheRead, output int64
}

// fakeProvider is a fake at a boundary we do not own (the model providers'
// APIs): it records what reached it and answers as they do: JSON with the
// usage rep says (gzipped when the request accepts gzip, as a provider's
// server may), or, for a body with "stream":true, Server-Sent Events: in
// Anthropic's form on /v1/messages (usage in message_start and
// message_delta), else in OpenAI's (a last usage chunk only when
// stream_options.include_usage asks for it). With "hang":true a stream
// stops after its first event until the caller goes away.
func fakeProvider(t *testing.T, got chan<- seen, rep func() report) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("X-Api-Key"), r.Header.Get("Authorization"), r.Header.Get("Cookie"), string(b)}
		var req struct {
			Stream        bool `json:"stream"`
			Hang          bool `json:"hang"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		_ = json.Unmarshal(b, &req)
		u := rep()
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			if strings.HasSuffix(r.URL.Path, "/messages") {
				anthropicStream(w, r, u, req.Hang)
			} else {
				openAIStream(w, u, req.StreamOptions.IncludeUsage)
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=provider")
		if strings.HasSuffix(r.URL.Path, "/embeddings") {
			embeddings(w, u)
			return
		}
		var out io.Writer = w
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			defer zw.Close()
			out = zw
		}
		fmt.Fprintf(out, `{"id":"msg_1","usage":{"input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":%d}}`, u.input, u.cacheRead, u.output)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// anthropicStream answers as the Messages API streams: the input in
// message_start, the output so far in message_delta.
func anthropicStream(w http.ResponseWriter, r *http.Request, u report, hang bool) {
	event := func(name, data string) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
		w.(http.Flusher).Flush()
	}
	event("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_1","content":[],"usage":{"input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":1}}}`, u.input, u.cacheRead))
	if hang {
		<-r.Context().Done()
		return
	}
	for i := range 3 {
		time.Sleep(50 * time.Millisecond)
		event("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\"usage\": %d"}}`, i))
	}
	event("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":%d}}`, u.output))
	event("message_stop", `{"type":"message_stop"}`)
}

// embeddings answers as OpenAI's embeddings do: megabytes of vectors, the
// usage at the end.
func embeddings(w io.Writer, u report) {
	vector := "[" + strings.Repeat("-0.0123456789,", 1535) + "0.5]"
	fmt.Fprint(w, `{"object":"list","data":[`)
	for i := range 128 {
		if i > 0 {
			fmt.Fprint(w, ",")
		}
		fmt.Fprintf(w, `{"object":"embedding","index":%d,"embedding":%s}`, i, vector)
	}
	fmt.Fprintf(w, `],"model":"m","usage":{"prompt_tokens":%d,"total_tokens":%d}}`, u.input, u.input)
}

// openAIStream answers as chat/completions streams: chunks, a last chunk
// with the usage only when asked, then [DONE].
func openAIStream(w http.ResponseWriter, u report, includeUsage bool) {
	for i := range 2 {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%d\"}}],\"usage\":null}\n\n", i)
		w.(http.Flusher).Flush()
	}
	if includeUsage {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", u.input, u.output, u.input+u.output)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

type fixture struct {
	proxy   *httptest.Server
	p       *Proxy
	st      *store.Store
	reg     *prometheus.Registry
	got     chan seen
	account string
	sbKey   string // a live sandbox key
	revoked string // the key of a sandbox that ended
	foreign string // an account key (not a sandbox's)
	options Options

	mu  sync.Mutex
	rep report // what the fake provider reports for each answer
}

func newFixture(t *testing.T, maxBody int64) *fixture {
	return newFixtureWith(t, func(o *Options) { o.MaxBody = maxBody })
}

// newFixtureWith builds a proxy in front of a fake provider (see
// fakeProvider); configure adjusts its options.
func newFixtureWith(t *testing.T, configure func(*Options)) *fixture {
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
	f := &fixture{st: st, reg: prometheus.NewRegistry(), got: make(chan seen, 256), account: acct.ID, rep: report{input: 12, output: 34}}
	f.sbKey, f.revoked, f.foreign = key("sbx_live"), key("sbx_gone"), key("")
	if err := st.RevokeSandboxKeys(ctx, "sbx_gone", time.Now()); err != nil {
		t.Fatal(err)
	}
	up := fakeProvider(t, f.got, f.report)
	f.options = Options{
		Auth: auth.NewAuthenticator(st),
		Upstreams: map[string]Upstream{
			Anthropic: {BaseURL: up.URL, APIKey: realAnthropicKey},
			OpenAI:    {BaseURL: up.URL + "/api/v1", APIKey: realOpenAIKey},
		},
		Registry: f.reg,
		Usage:    st,
	}
	configure(&f.options)
	p, err := New(f.options)
	if err != nil {
		t.Fatal(err)
	}
	f.p = p
	f.proxy = httptest.NewServer(p)
	t.Cleanup(f.proxy.Close)
	return f
}

func (f *fixture) report() report {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rep
}

func (f *fixture) setReport(r report) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rep = r
}

func (f *fixture) do(t *testing.T, path string, headers map[string]string, body string) (*http.Response, string) {
	t.Helper()
	return f.doMethod(t, "POST", path, headers, body)
}

func (f *fixture) doMethod(t *testing.T, method, path string, headers map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.proxy.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
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
		wantBody   string // default: as sent
	}{
		{"anthropic with x-api-key", "/model/anthropic/v1/messages?beta=true", map[string]string{"x-api-key": f.sbKey, "Cookie": "a=b"}, 200, "/v1/messages", realAnthropicKey, "", ""},
		{"openai with bearer", "/model/openai/chat/completions", map[string]string{"Authorization": "Bearer " + f.sbKey}, 200, "/api/v1/chat/completions", "", "Bearer " + realOpenAIKey, `{"model":"m","store":false}`},
		{"both headers, same key", "/model/anthropic/v1/messages", map[string]string{"x-api-key": f.sbKey, "Authorization": "Bearer " + f.sbKey}, 200, "/v1/messages", realAnthropicKey, "", ""},
		{"both headers, different keys", "/model/anthropic/v1/messages", map[string]string{"x-api-key": f.sbKey, "Authorization": "Bearer " + f.foreign}, 401, "", "", "", ""},
		{"revoked sandbox key", "/model/anthropic/v1/messages", map[string]string{"x-api-key": f.revoked}, 401, "", "", "", ""},
		{"unknown key", "/model/anthropic/v1/messages", map[string]string{"x-api-key": "sbx_nope"}, 401, "", "", "", ""},
		{"no key", "/model/anthropic/v1/messages", nil, 401, "", "", "", ""},
		{"account key, not a sandbox's", "/model/anthropic/v1/messages", map[string]string{"x-api-key": f.foreign}, 403, "", "", "", ""},
		{"the operator's own key is not a sandbox key", "/model/anthropic/v1/messages", map[string]string{"x-api-key": realAnthropicKey}, 401, "", "", "", ""},
		{"path climbing out of the base", "/model/openai/..%2f..%2fadmin", map[string]string{"x-api-key": f.sbKey}, 403, "", "", "", ""},
		{"unknown provider", "/model/other/v1", map[string]string{"x-api-key": f.sbKey}, 404, "", "", "", ""},
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
			wantBody := tc.wantBody
			if wantBody == "" {
				wantBody = `{"model":"m"}`
			}
			if s.path != tc.wantPath || s.apiKey != tc.wantAPIKey || s.authz != tc.wantAuthz || s.cookie != "" || s.body != wantBody {
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
	if err != nil || line != "event: message_start\n" || time.Since(start) > 90*time.Millisecond {
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

// gauge finds one gauge in the registry.
func (f *fixture) gauge(t *testing.T, name string, labels map[string]string) float64 {
	return f.counterVec(t, name, labels)
}

// counterVec finds one series (a counter's or a gauge's) in the registry.
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
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s %v", name, labels)
	return 0
}

package modelproxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// clock is a settable time for the budgets' days.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// otherNode is a second proxy on the fixture's database and provider, as
// another node of a cluster runs one.
func (f *fixture) otherNode(t *testing.T) *httptest.Server {
	t.Helper()
	opts := f.options
	opts.Registry = prometheus.NewRegistry()
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv
}

// budgetRefusal checks a 429 of a spent budget and returns its message.
func budgetRefusal(t *testing.T, resp *http.Response, body string) string {
	t.Helper()
	var e struct{ Status, Error string }
	if resp.StatusCode != http.StatusTooManyRequests || json.Unmarshal([]byte(body), &e) != nil || e.Status != "error" {
		t.Fatalf("want a 429 JSON error, got %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("Retry-After") == "" || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("headers %v", resp.Header)
	}
	return e.Error
}

// TestProxyTokenBudget is the review's case: 120 calls each reported (by
// the fake provider, see fakeProvider) as 2 M tokens. Under a budget of
// 5 M tokens a day the calls that start under it are forwarded (three:
// 0, 2 M and 4 M used before them); every later one is refused with 429
// saying which budget, how much is used and when it resets, on this node
// and on another node sharing the database; the next UTC day starts
// afresh.
func TestProxyTokenBudget(t *testing.T) {
	securitytest.Attack(t, "quotas",
		"code in a sandbox makes 120 model calls, each reported as 2 M tokens, on the operator's key, from two nodes of a cluster",
		"with a daily budget of 5 M tokens per account only the 3 calls that start under it are forwarded; the other 117 are 429 (budget, usage and reset time in the message, Retry-After, X-Should-Retry: false) on both nodes and counted in sandboxd_model_refused_total; the next UTC day is forwarded again")
	clk := &clock{now: time.Date(2025, 3, 14, 22, 30, 0, 0, time.UTC)}
	f := newFixtureWith(t, func(o *Options) {
		o.Budgets = Budgets{TokensPerDay: 5_000_000}
		o.Now = clk.Now
	})
	f.setReport(report{input: 1_500_000, cacheRead: 400_000, output: 100_000})
	other := f.otherNode(t)
	key := map[string]string{"x-api-key": f.sbKey}

	forwarded, refused := 0, 0
	var msg string
	for i := range 120 {
		url := f.proxy.URL
		if i%2 == 1 {
			url = other.URL
		}
		req, _ := http.NewRequest("POST", url+"/model/anthropic/v1/messages?beta=true", strings.NewReader(`{"model":"m"}`))
		for k, v := range key {
			req.Header.Set(k, v)
		}
		resp, body := send(t, req)
		switch resp.StatusCode {
		case http.StatusOK:
			forwarded++
			<-f.got
		default:
			refused++
			msg = budgetRefusal(t, resp, body)
		}
	}
	if forwarded != 3 || refused != 117 {
		t.Fatalf("forwarded %d, refused %d; want 3 and 117", forwarded, refused)
	}
	for _, want := range []string{"daily model token budget", "6000000 of 5000000 tokens used today (UTC)", "resets at 2025-03-15T00:00:00Z", "(in 1h30m).", "GET /api/model/usage"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not say %q", msg, want)
		}
	}
	select {
	case s := <-f.got:
		t.Fatalf("a refused request reached the provider: %+v", s)
	default:
	}
	// This node refused half of them (the even calls from the fifth on);
	// the other node the rest.
	if n := f.counterVec(t, "sandboxd_model_refused_total", map[string]string{"reason": "token_budget"}); n != 58 {
		t.Fatalf("this node counted %v token budget refusals", n)
	}
	if n := f.gauge(t, "sandboxd_model_daily_usage", map[string]string{"account": f.account, "kind": "tokens"}); n != 6_000_000 {
		t.Fatalf("the usage gauge says %v tokens", n)
	}
	u, err := f.p.Usage(t.Context(), f.account)
	if err != nil || u.Requests != 3 || u.InputTokens != 5_700_000 || u.OutputTokens != 300_000 || !u.ResetsAt.Equal(time.Date(2025, 3, 15, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("usage %+v, %v", u, err)
	}

	// A new UTC day.
	clk.set(time.Date(2025, 3, 15, 0, 0, 1, 0, time.UTC))
	if resp, body := f.do(t, "/model/anthropic/v1/messages", key, `{"model":"m"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("the next day: %d %s", resp.StatusCode, body)
	}
	<-f.got
}

// TestProxyRequestBudget: an account's requests are counted whatever they
// used (a count_tokens call reports none), and past the daily request
// budget refused before they are forwarded.
func TestProxyRequestBudget(t *testing.T) {
	securitytest.Attack(t, "quotas",
		"code in a sandbox calls the model proxy without end, with requests that report no tokens (count_tokens, model lists)",
		"with a daily budget of 3 requests per account the fourth is 429 and not forwarded, whatever the tokens")
	clk := &clock{now: time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)}
	f := newFixtureWith(t, func(o *Options) {
		o.Budgets = Budgets{RequestsPerDay: 3, TokensPerDay: 1 << 40}
		o.Now = clk.Now
	})
	f.setReport(report{})
	key := map[string]string{"x-api-key": f.sbKey}
	for i := range 3 {
		if resp, body := f.do(t, "/model/anthropic/v1/messages/count_tokens?beta=true", key, `{"model":"m"}`); resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, body)
		}
		<-f.got
	}
	resp, body := f.doMethod(t, "GET", "/model/anthropic/v1/models", key, "")
	msg := budgetRefusal(t, resp, body)
	if !strings.Contains(msg, "daily model request budget is spent: 3 of 3 requests used today") || !strings.Contains(msg, "resets at 2025-03-15T00:00:00Z") {
		t.Fatalf("message %q", msg)
	}
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra != 12*3600 {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	select {
	case s := <-f.got:
		t.Fatalf("a refused request reached the provider: %+v", s)
	default:
	}
}

// TestProxyBudgetsNeedAStore: budgets without a place to count them are a
// configuration error, not silently unlimited.
func TestProxyBudgetsNeedAStore(t *testing.T) {
	_, err := New(Options{Auth: nopAuth{}, Budgets: Budgets{TokensPerDay: 1}})
	if err == nil {
		t.Fatal("budgets without a usage store were accepted")
	}
}

func send(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

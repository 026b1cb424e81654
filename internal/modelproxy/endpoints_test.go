package modelproxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestProxyForwardsOnlyInferenceEndpoints: with its own key, code in a
// sandbox reaches the providers' inference endpoints and nothing else of
// theirs (the provider is a fake, see fakeProvider): not the files,
// batches, stored completions and responses, vector stores or the
// organization that every tenant's sandboxes share through the operator's
// key, however the path is spelled.
func TestProxyForwardsOnlyInferenceEndpoints(t *testing.T) {
	securitytest.Attack(t, "model proxy",
		"code in a sandbox calls provider endpoints other than inference through the model proxy with its own key (OpenAI files, batches, stored chat completions, responses, DELETE /files/…, organization costs, vector stores; Anthropic batches, files, organizations/api_keys), also by path tricks (.., %2F, //, trailing segments, other methods)",
		"each is 403 with a JSON message naming what is forwarded, and nothing reaches the provider; the inference endpoints (with Claude Code's ?beta=true) still reach it")
	f := newFixture(t, 0)
	key := map[string]string{"x-api-key": f.sbKey}

	allowed := []struct {
		method, path string
		wantPath     string // at the provider (the OpenAI base URL ends in /api/v1)
		wantQuery    string
	}{
		{"POST", "/model/anthropic/v1/messages?beta=true", "/v1/messages", "beta=true"},
		{"POST", "/model/anthropic/v1/messages/count_tokens?beta=true", "/v1/messages/count_tokens", "beta=true"},
		{"GET", "/model/anthropic/v1/models?beta=true&limit=1000", "/v1/models", "beta=true&limit=1000"},
		{"GET", "/model/anthropic/v1/models/claude-sonnet-4-5", "/v1/models/claude-sonnet-4-5", ""},
		{"POST", "/model/openai/chat/completions", "/api/v1/chat/completions", ""},
		{"POST", "/model/openai/v1/chat/completions", "/api/v1/chat/completions", ""},
		{"POST", "/model/openai/completions", "/api/v1/completions", ""},
		{"POST", "/model/openai/embeddings", "/api/v1/embeddings", ""},
		{"GET", "/model/openai/models", "/api/v1/models", ""},
		{"GET", "/model/openai/v1/models/ft:gpt-4o:acme:x:abc1", "/api/v1/models/ft:gpt-4o:acme:x:abc1", ""},
		// The query string is passed on and chooses nothing.
		{"POST", "/model/openai/chat/completions?x=/../files", "/api/v1/chat/completions", "x=/../files"},
	}
	for _, tc := range allowed {
		t.Run("allowed "+tc.method+" "+tc.path, func(t *testing.T) {
			body := `{"model":"m"}`
			if tc.method == "GET" {
				body = ""
			}
			resp, got := f.doMethod(t, tc.method, tc.path, key, body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d: %s", resp.StatusCode, got)
			}
			s := <-f.got
			if s.method != tc.method || s.path != tc.wantPath || s.query != tc.wantQuery {
				t.Fatalf("the provider saw %s %s?%s", s.method, s.path, s.query)
			}
		})
	}

	refused := []struct{ method, path string }{
		{"POST", "/model/openai/files"},
		{"GET", "/model/openai/files"},
		{"GET", "/model/openai/files/file-abc/content"},
		{"DELETE", "/model/openai/files/file-abc"},
		{"POST", "/model/openai/batches"},
		{"GET", "/model/openai/batches"},
		{"GET", "/model/openai/chat/completions"}, // the stored completions
		{"GET", "/model/openai/chat/completions/chatcmpl-1"},
		{"GET", "/model/openai/chat/completions/chatcmpl-1/messages"},
		{"DELETE", "/model/openai/chat/completions/chatcmpl-1"},
		{"POST", "/model/openai/responses"},
		{"GET", "/model/openai/responses/resp_1"},
		{"GET", "/model/openai/organization/costs"},
		{"POST", "/model/openai/vector_stores"},
		{"DELETE", "/model/openai/models/ft:gpt-4o:acme:x:abc1"},
		{"POST", "/model/openai/v1/files"},
		{"POST", "/model/anthropic/v1/messages/batches"},
		{"GET", "/model/anthropic/v1/messages/batches"},
		{"GET", "/model/anthropic/v1/files"},
		{"GET", "/model/anthropic/v1/organizations/api_keys"},
		{"GET", "/model/anthropic/v1/messages"},
		{"PUT", "/model/openai/chat/completions"},
		{"HEAD", "/model/openai/chat/completions"},
		{"OPTIONS", "/model/anthropic/v1/messages"},
		// Path tricks.
		{"POST", "/model/openai/chat/completions/../files"},
		{"POST", "/model/openai/chat/completions/..%2f..%2ffiles"},
		{"POST", "/model/openai/chat%2fcompletions"},
		{"POST", "/model/openai/chat%2Fcompletions"},
		{"POST", "/model/openai/%63hat/completions"},
		{"POST", "/model/openai//chat/completions"},
		{"POST", "/model/openai/chat//completions"},
		{"POST", "/model/openai/chat/completions/"},
		{"POST", "/model/openai/./chat/completions"},
		{"POST", "/model/openai/chat/completions/x"},
		{"POST", "/model/openai/v1/v1/chat/completions"},
		{"POST", "/model/openai/chat/completions;files"},
		{"POST", "/model/openai/..%2f..%2fadmin"},
		{"POST", "/model/anthropic/v1/messages/../batches"},
		{"POST", "/model/anthropic/v1/messages/%2e%2e/batches"},
		{"POST", "/model/anthropic/v1/messages%2f..%2fbatches"},
		{"POST", "/model/anthropic/messages"},
		{"POST", "/model/anthropic/"},
		{"POST", "/model/anthropic"},
		{"GET", "/model/openai/models/a/b"},
	}
	for _, tc := range refused {
		t.Run("refused "+tc.method+" "+tc.path, func(t *testing.T) {
			resp, got := f.doMethod(t, tc.method, tc.path, key, `{"model":"m"}`)
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("%d, want 403: %s", resp.StatusCode, got)
			}
			if tc.method != "HEAD" {
				var e struct{ Status, Error string }
				if err := json.Unmarshal([]byte(got), &e); err != nil || e.Status != "error" || !strings.Contains(e.Error, "only inference endpoints") {
					t.Fatalf("body %q (%v)", got, err)
				}
			}
			select {
			case s := <-f.got:
				t.Fatalf("a refused request reached the provider: %+v", s)
			default:
			}
		})
	}
	if n := f.counterVec(t, "sandboxd_model_refused_total", map[string]string{"reason": "endpoint"}); n != float64(len(refused)) {
		t.Fatalf("refusals counted: %v, want %d", n, len(refused))
	}
}

// TestProxyResolvesTheVersionOnce: an OpenAI-compatible base URL with or
// without /v1, and clients configured with or without it, never make
// /v1/v1.
func TestProxyResolvesTheVersionOnce(t *testing.T) {
	for _, tc := range []struct {
		base, path, want string
	}{
		{"http://p/v1", "chat/completions", "chat/completions"},
		{"http://p/v1", "v1/chat/completions", "chat/completions"},
		{"http://p", "chat/completions", "chat/completions"},
		{"http://p", "v1/chat/completions", "v1/chat/completions"},
		{"http://p/api/openai", "v1/models", "v1/models"},
	} {
		p, err := New(Options{Auth: nopAuth{}, Upstreams: map[string]Upstream{OpenAI: {BaseURL: tc.base}}})
		if err != nil {
			t.Fatal(err)
		}
		method := "POST"
		if strings.HasSuffix(tc.path, "models") {
			method = "GET"
		}
		_, got, ok := p.upstreams[OpenAI].resolve(method, tc.path)
		if !ok || got != tc.want {
			t.Errorf("%s + %s: %q %v, want %q", tc.base, tc.path, got, ok, tc.want)
		}
	}
}

// TestProxyNeverLetsTheProviderStore: a chat completion is sent with
// store: false whatever the client asked (the provider is a fake, see
// fakeProvider), and a stream asks for its usage; the rest of the body is
// kept.
func TestProxyNeverLetsTheProviderStore(t *testing.T) {
	securitytest.Attack(t, "model proxy",
		"code in a sandbox asks the OpenAI-compatible provider to store its chat completion (store: true), where every tenant holding the operator's key could list and read it",
		"the proxy forwards every chat completion with store: false (a client's true replaced) and refuses a body that is not a JSON object (400) rather than forward what it cannot check")
	f := newFixture(t, 0)
	key := map[string]string{"Authorization": "Bearer " + f.sbKey}
	for _, tc := range []struct {
		name, body  string
		wantStatus  int
		wantForward map[string]any // fields the provider must see
	}{
		{"store true", `{"model":"m","store":true,"messages":[{"role":"user","content":"<b>&</b>"}]}`, 200,
			map[string]any{"store": false, "model": "m", "messages": []any{map[string]any{"role": "user", "content": "<b>&</b>"}}}},
		{"no store", `{"model":"m"}`, 200, map[string]any{"store": false}},
		{"store twice", `{"store":true,"model":"m","store":true}`, 200, map[string]any{"store": false}},
		{"stream without options", `{"model":"m","stream":true}`, 200,
			map[string]any{"store": false, "stream_options": map[string]any{"include_usage": true}}},
		{"stream with options", `{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":1}}`, 200,
			map[string]any{"stream_options": map[string]any{"include_usage": true, "x": float64(1)}}},
		{"stream options not an object", `{"model":"m","stream":true,"stream_options":[1]}`, 400, nil},
		{"not JSON", `store=true`, 400, nil},
		{"not an object", `[{"store":true}]`, 400, nil},
		{"null", `null`, 400, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, got := f.do(t, "/model/openai/chat/completions", key, tc.body)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("%d, want %d: %s", resp.StatusCode, tc.wantStatus, got)
			}
			if tc.wantForward == nil {
				select {
				case s := <-f.got:
					t.Fatalf("forwarded: %+v", s)
				default:
				}
				return
			}
			s := <-f.got
			var sent map[string]any
			if err := json.Unmarshal([]byte(s.body), &sent); err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.wantForward {
				if b1, _ := json.Marshal(sent[k]); string(b1) != mustJSON(t, v) {
					t.Errorf("%s = %s, want %s (body %s)", k, b1, mustJSON(t, v), s.body)
				}
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// nopAuth accepts no key, for tests that never authenticate.
type nopAuth struct{}

func (nopAuth) Authenticate(context.Context, string) (auth.Principal, error) {
	return auth.Principal{}, auth.ErrUnauthorized
}

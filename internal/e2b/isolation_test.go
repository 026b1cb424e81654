package e2b

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// sandboxKey mints the key sandboxd gives the code inside sandbox id of
// the account whose key is accountKey (RECOUP_API_KEY).
func (f *fixture) sandboxKey(accountKey, id string) string {
	f.t.Helper()
	p, err := auth.NewAuthenticator(f.st).Authenticate(f.t.Context(), accountKey)
	if err != nil {
		f.t.Fatal(err)
	}
	plaintext, prefix, hash, err := auth.NewKey()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.st.CreateAPIKey(f.t.Context(), &store.APIKey{AccountID: p.AccountID, Name: "sandbox", Prefix: prefix, Hash: hash, SandboxID: envd.SandboxID(id)}); err != nil {
		f.t.Fatal(err)
	}
	return plaintext
}

// raw sends a request and returns its status and body.
func (f *fixture) raw(method, path string, headers map[string]string, body string) (int, string) {
	f.t.Helper()
	req, _ := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSandboxKeyReadsOnly: the key given to the code inside a sandbox reads
// the E2B control plane as it reads the REST API, and never gets what lets
// it act: no envd or traffic token in any answer, and every route that
// changes something is 403.
func TestSandboxKeyReadsOnly(t *testing.T) {
	securitytest.Attack(t, "e2b", "code in a sandbox calls E2B's GET /sandboxes/{id} and the list with its own RECOUP_API_KEY for its own and a sibling sandbox, to take their envdAccessToken and run commands as root there, then tries every E2B route that acts",
		"the answers carry no envdAccessToken nor trafficAccessToken (account keys still get them); create, connect, kill, timeout, refresh, pause, resume, fork and network are 403; the sandbox is untouched")
	f := newFixture(t)
	own := f.create(f.key, nil)
	sibling := f.create(f.key, map[string]any{"network": map[string]any{"allowOut": []string{"198.51.100.7"}, "allowPublicTraffic": false}})
	if sibling.TrafficAccessToken == nil {
		t.Fatal("no traffic token for a sandbox without public traffic")
	}
	secrets := []string{own.EnvdAccessToken, sibling.EnvdAccessToken, *sibling.TrafficAccessToken}
	sk := map[string]string{"X-API-Key": f.sandboxKey(f.key, own.SandboxID)}

	for _, path := range []string{"/sandboxes/" + own.SandboxID, "/sandboxes/" + sibling.SandboxID, "/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=running,paused", "/sandboxes/" + sibling.SandboxID + "/metrics", "/templates"} {
		code, body := f.raw("GET", path, sk, "")
		if code != http.StatusOK {
			t.Errorf("GET %s with a sandbox's key: %d %s, want 200 (it may read)", path, code, body)
		}
		for _, s := range secrets {
			if strings.Contains(body, s) {
				t.Errorf("GET %s with a sandbox's key answered a sandbox's token: %s", path, body)
			}
		}
		if strings.Contains(body, "envdAccessToken") || strings.Contains(body, "trafficAccessToken") {
			t.Errorf("GET %s with a sandbox's key names a token field: %s", path, body)
		}
	}
	// An account key still gets the token it needs to reach the agent.
	var detail sandboxDetail
	if resp := f.call("GET", "/sandboxes/"+sibling.SandboxID, map[string]string{"X-API-Key": f.key}, nil, &detail); resp.StatusCode != 200 || detail.EnvdAccessToken != sibling.EnvdAccessToken {
		t.Fatalf("get with the account's key: %d %+v, want its token", resp.StatusCode, detail)
	}

	for _, c := range []struct{ method, path, body string }{
		{"POST", "/sandboxes", `{"templateID":"base"}`},
		{"POST", "/v2/sandboxes", `{"templateID":"base"}`},
		{"POST", "/sandboxes/" + sibling.SandboxID + "/connect", `{"timeout":60}`},
		{"POST", "/v2/sandboxes/" + sibling.SandboxID + "/connect", `{"timeout":60}`},
		{"POST", "/sandboxes/" + sibling.SandboxID + "/resume", `{}`},
		{"POST", "/sandboxes/" + sibling.SandboxID + "/timeout", `{"timeout":86400}`},
		{"POST", "/sandboxes/" + sibling.SandboxID + "/refreshes", `{"duration":600}`},
		{"POST", "/sandboxes/" + sibling.SandboxID + "/pause", ``},
		{"POST", "/sandboxes/" + sibling.SandboxID + "/fork", `{"count":1}`},
		{"PUT", "/sandboxes/" + sibling.SandboxID + "/network", `{}`},
		{"DELETE", "/sandboxes/" + sibling.SandboxID, ``},
		{"DELETE", "/sandboxes/" + own.SandboxID, ``},
	} {
		code, body := f.raw(c.method, c.path, sk, c.body)
		if code != http.StatusForbidden {
			t.Errorf("%s %s with a sandbox's key: %d %s, want 403", c.method, c.path, code, body)
		}
		for _, s := range secrets {
			if strings.Contains(body, s) {
				t.Errorf("%s %s with a sandbox's key answered a token: %s", c.method, c.path, body)
			}
		}
	}
	if code, _ := f.raw("GET", "/sandboxes/"+sibling.SandboxID, map[string]string{"X-API-Key": f.key}, ""); code != http.StatusOK {
		t.Fatalf("the sibling after the attempts: %d, want it still running", code)
	}
}

// TestAccessRuleIsMayActFor: the E2B control plane decides who may act on a
// sandbox with the rule the REST API uses (auth.MayActFor): an
// organization's key acts for its members' sandboxes, an unrelated
// account's key sees none.
func TestAccessRuleIsMayActFor(t *testing.T) {
	f := newFixture(t)
	org := store.Account{Name: "acme", Kind: store.AccountOrg}
	if err := f.st.CreateAccount(t.Context(), &org); err != nil {
		t.Fatal(err)
	}
	orgKey, prefix, hash, err := auth.NewE2BKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.CreateAPIKey(t.Context(), &store.APIKey{AccountID: org.ID, Name: "k", Prefix: prefix, Hash: hash}); err != nil {
		t.Fatal(err)
	}
	p, err := auth.NewAuthenticator(f.st).Authenticate(t.Context(), f.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.AddOrgMember(t.Context(), org.ID, p.AccountID); err != nil {
		t.Fatal(err)
	}
	sb := f.create(f.key, map[string]any{"metadata": map[string]string{"k": "v"}})
	var detail sandboxDetail
	if resp := f.call("GET", "/sandboxes/"+sb.SandboxID, map[string]string{"X-API-Key": orgKey}, nil, &detail); resp.StatusCode != 200 || detail.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("the organization's key on a member's sandbox: %d %+v, want it served as the REST API serves it", resp.StatusCode, detail)
	}
	var forks []forkResult
	if resp := f.call("POST", "/sandboxes/"+sb.SandboxID+"/fork", map[string]string{"X-API-Key": orgKey}, map[string]any{"count": 1}, &forks); resp.StatusCode != 201 || len(forks) != 1 || forks[0].Sandbox == nil {
		t.Fatalf("the organization forks a member's sandbox: %d %+v", resp.StatusCode, forks)
	}
	// The child is the member's, like its parent: the member sees it.
	if resp := f.call("GET", "/sandboxes/"+forks[0].Sandbox.SandboxID, map[string]string{"X-API-Key": f.key}, nil, nil); resp.StatusCode != 200 {
		t.Fatalf("the member gets the fork of its sandbox: %d, want 200", resp.StatusCode)
	}
	if resp := f.call("GET", "/sandboxes/"+sb.SandboxID, map[string]string{"X-API-Key": f.otherKey}, nil, nil); resp.StatusCode != 404 {
		t.Fatalf("an unrelated account's key: %d, want 404", resp.StatusCode)
	}
}

// TestTimeoutBounds: a timeout no duration can hold is refused, not
// wrapped around into a short or a default lifetime.
func TestTimeoutBounds(t *testing.T) {
	securitytest.Attack(t, "e2b", "E2B timeouts no duration holds: create with timeout 9223372037 s, set timeout 18446744074 s (which wrapped to 0.29 s and stopped the sandbox), refresh, connect and fork likewise",
		"400 naming the range (1 to --sandbox-max-timeout seconds); the sandbox's lifetime is unchanged")
	f := newFixture(t, func(o *fixtureOptions) { o.MaxTimeout = 24 * time.Hour })
	key := map[string]string{"X-API-Key": f.key}
	sb := f.create(f.key, nil)
	for _, n := range []string{"18446744074", "9223372037", "86401", "-1", "0"} {
		if code, body := f.raw("POST", "/v2/sandboxes", key, `{"templateID":"base","timeout":`+n+`}`); code != 400 {
			t.Errorf("create with timeout %s: %d %s, want 400", n, code, body)
		}
		if code, body := f.raw("POST", "/sandboxes/"+sb.SandboxID+"/timeout", key, `{"timeout":`+n+`}`); code != 400 {
			t.Errorf("timeout %s: %d %s, want 400", n, code, body)
		}
		if code, body := f.raw("POST", "/sandboxes/"+sb.SandboxID+"/refreshes", key, `{"duration":`+n+`}`); code != 400 {
			t.Errorf("refresh %s: %d %s, want 400", n, code, body)
		}
		if code, body := f.raw("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", key, `{"timeout":`+n+`}`); code != 400 {
			t.Errorf("connect with timeout %s: %d %s, want 400", n, code, body)
		}
		if code, body := f.raw("POST", "/sandboxes/"+sb.SandboxID+"/fork", key, `{"timeout":`+n+`}`); code != 400 {
			t.Errorf("fork with timeout %s: %d %s, want 400", n, code, body)
		}
	}
	if code, body := f.raw("POST", "/v2/sandboxes", key, `{"templateID":"base","timeout":86400}`); code != 201 {
		t.Fatalf("create with the longest timeout: %d %s", code, body)
	}
	if f.sbs.last.Lifetime != 24*time.Hour {
		t.Fatalf("lifetime %v, want 24h", f.sbs.last.Lifetime)
	}
}

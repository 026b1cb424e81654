package edge

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// keys is a fake of auth: one key, by plaintext and by id (the real rule
// is tested in internal/auth).
type keys struct{}

func (keys) Authenticate(_ context.Context, plaintext string) (auth.Principal, error) {
	if plaintext == "good" {
		return auth.Principal{KeyID: "k1", AccountID: "a1"}, nil
	}
	return auth.Principal{}, auth.ErrUnauthorized
}

func (keys) AuthenticateKeyID(_ context.Context, id string) (auth.Principal, error) {
	if id == "k1" {
		return auth.Principal{KeyID: "k1", AccountID: "a1"}, nil
	}
	return auth.Principal{}, auth.ErrUnauthorized
}

func (keys) ResolveAccount(context.Context, auth.Principal, string) (string, error) {
	return "a1", nil
}

func (keys) SandboxFor(context.Context, auth.Principal, string, string) (store.Sandbox, error) {
	return store.Sandbox{}, nil
}

func (keys) RunFor(context.Context, auth.Principal, string, string) (store.Run, error) {
	return store.Run{}, nil
}

// nodes is a fake cluster: a forward is signed when it carries
// X-Signed: KEYID, sandbox "remote" is on node n2, and forwards are
// recorded.
type nodes struct{ forwarded []string }

func (c *nodes) Forwarded(r *http.Request) (string, bool, error) {
	if id := r.Header.Get("X-Signed"); id != "" {
		return id, r.Header.Get("X-Placed") != "", nil
	}
	return "", false, errors.New("no signature")
}

func (c *nodes) HostOf(_ context.Context, id string) (string, bool) { return "n2", id == "remote" }

func (c *nodes) Place(context.Context, *netpol.Policy) (string, bool, error) {
	return "n2", false, nil
}

func (c *nodes) Forward(_ http.ResponseWriter, _ *http.Request, node, keyID string, _ bool) {
	c.forwarded = append(c.forwarded, node+"/"+keyID)
}

func (c *nodes) Do(*http.Request, string, string, bool) (*http.Response, error) {
	return nil, errors.New("unused")
}

// TestAuthenticate: a key in the headers on the public listener; on the
// cluster listener only the key a valid signature names, and never a key
// in the headers.
func TestAuthenticate(t *testing.T) {
	cluster := &nodes{}
	gate, err := NewGate(keys{}, cluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got Caller
	var gotErr error
	capture := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, gotErr = gate.Authenticate(r, nil)
	})
	refuse := func(w http.ResponseWriter, r *http.Request, err error) {
		e, _ := Explain(err, "")
		w.WriteHeader(e.Status)
	}
	listener := ClusterHandler(cluster, capture, nil, refuse)
	serve := func(h http.Handler, headers map[string]string) int {
		got, gotErr = Caller{}, nil
		r := httptest.NewRequest(http.MethodGet, "/api/sandboxes", nil)
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}

	serve(capture, map[string]string{"X-API-Key": "good"})
	if gotErr != nil || got.KeyID != "k1" || got.Forwarded {
		t.Fatalf("key: %+v %v", got, gotErr)
	}
	serve(capture, map[string]string{"X-API-Key": "bad"})
	if !errors.Is(gotErr, auth.ErrUnauthorized) {
		t.Fatalf("bad key: %v", gotErr)
	}
	serve(capture, nil)
	if !errors.Is(gotErr, auth.ErrCredentials) {
		t.Fatalf("no key: %v", gotErr)
	}
	// A signature on the public listener counts for nothing.
	serve(capture, map[string]string{"X-Signed": "k1"})
	if !errors.Is(gotErr, auth.ErrCredentials) {
		t.Fatalf("signature on the public listener: %+v %v", got, gotErr)
	}

	if code := serve(listener, map[string]string{"X-Signed": "k1", "X-Placed": "1"}); code != http.StatusOK || gotErr != nil || !got.Forwarded || !got.Placed || got.KeyID != "k1" {
		t.Fatalf("signed forward: %d %+v %v", code, got, gotErr)
	}
	if code := serve(listener, map[string]string{"X-Signed": "k9"}); !errors.Is(gotErr, auth.ErrUnauthorized) {
		t.Fatalf("signed forward of an unknown key: %d %v", code, gotErr)
	}
	if code := serve(listener, map[string]string{"X-API-Key": "good"}); code != http.StatusUnauthorized || got.KeyID != "" {
		t.Fatalf("unsigned request on the cluster listener: %d %+v", code, got)
	}
	if code := serve(ClusterHandler(nil, capture, nil, refuse), map[string]string{"X-Signed": "k1"}); code != http.StatusUnauthorized {
		t.Fatalf("cluster listener without a cluster: %d", code)
	}
}

// TestForwarding: a request goes to the node that hosts its sandbox, once:
// never again from the node it was forwarded to, never on a single node.
func TestForwarding(t *testing.T) {
	cluster := &nodes{}
	gate, _ := NewGate(keys{}, cluster, nil)
	caller := Caller{Principal: auth.Principal{KeyID: "k1"}}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if !gate.ForwardIfElsewhere(httptest.NewRecorder(), r, caller, "remote") || len(cluster.forwarded) != 1 || cluster.forwarded[0] != "n2/k1" {
		t.Fatalf("not forwarded to the host: %v", cluster.forwarded)
	}
	if gate.ForwardIfElsewhere(httptest.NewRecorder(), r, caller, "local") {
		t.Fatal("a local sandbox was forwarded")
	}
	forwarded := caller
	forwarded.Forwarded = true
	if gate.ForwardIfElsewhere(httptest.NewRecorder(), r, forwarded, "remote") {
		t.Fatal("a forwarded request was forwarded again")
	}
	if _, local, _ := gate.Place(context.Background(), forwarded, nil); !local {
		t.Fatal("a create placed here was placed again")
	}
	if node, local, _ := gate.Place(context.Background(), caller, nil); local || node != "n2" {
		t.Fatalf("placement not asked: %q %v", node, local)
	}
	single, _ := NewGate(keys{}, nil, nil)
	if single.ForwardIfElsewhere(httptest.NewRecorder(), r, caller, "remote") {
		t.Fatal("a single node forwarded")
	}
	if _, local, _ := single.Place(context.Background(), caller, nil); !local {
		t.Fatal("a single node placed elsewhere")
	}
}

// TestUnescaped: an escaped path parameter is read as meant; one that is
// not a valid escape is kept as sent.
func TestUnescaped(t *testing.T) {
	for in, want := range map[string]string{"work%3Alatest": "work:latest", "work:latest": "work:latest", "tpl_1": "tpl_1", "bad%zz": "bad%zz"} {
		if got := Unescaped(in); got != want {
			t.Errorf("Unescaped(%q) = %q, want %q", in, got, want)
		}
	}
}

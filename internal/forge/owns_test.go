package forge

import (
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

func TestOwnsRepo(t *testing.T) {
	securitytest.Attack(t, "secrets",
		"an account names another repository on the configured GitHub owner (or any GitHub repository) as its github_repo or coding-agent repo_url, so that sandboxd's token pushes to it or opens pull requests in it",
		"OwnsRepo refuses every GitHub URL except the account's own mirror (OWNER/sandbox-<account id>); sandboxd's own and other hosts' URLs get no token and pass")
	g, err := NewGitHub(Options{Token: "t", Owner: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMirror(MirrorOptions{Forge: g, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	const acct = "6f1c0e4e-0000-4000-8000-000000000001"
	own := "https://github.com/acme/sandbox-" + acct
	cases := []struct {
		url string
		ok  bool
	}{
		{own, true},
		{own + ".git", true},
		{own + "/", true},
		{"https://GitHub.com/ACME/sandbox-" + acct, true},
		{"https://github.com/acme/sandbox-6f1c0e4e-0000-4000-8000-000000000002", false}, // another account's mirror
		{"https://github.com/acme/secret-product", false},                               // the owner's other repository
		{"https://github.com/evil/sandbox-" + acct, false},                              // same name, other owner
		{"https://www.github.com/acme/secret-product", false},
		{"http://github.com/acme/secret-product", false},
		{"https://x:y@github.com/acme/sandbox-" + acct, false},
		{"https://github.com/acme/sandbox-" + acct + "/tree/main", false},
		{"https://github.com:443/acme/secret-product", false},
		{"git@github.com:acme/secret-product.git", false},
		{"http://127.0.0.1:8080/git/" + acct + ".git", true}, // sandboxd's own server
		{"https://gitlab.example/acme/thing", true},          // no token goes there
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			err := m.OwnsRepo(acct, tc.url)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrNotOwned)) {
				t.Fatalf("OwnsRepo = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	var none *Mirror
	if err := none.OwnsRepo(acct, "https://github.com/acme/secret-product"); err != nil {
		t.Fatalf("without a forge: %v", err)
	}
}

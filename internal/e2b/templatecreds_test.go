package e2b

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/oci"
)

// TestRegistryCredentials: E2B's fromImageRegistry as the build's
// credentials: registry is Basic, gcp Basic with the key as _json_key's
// password, aws and unknown types 400 by name, and no refusal shows a
// secret.
func TestRegistryCredentials(t *testing.T) {
	key := `{"type":"service_account","private_key":"-----BEGIN PRIVATE KEY-----\nsecret-key\n-----END PRIVATE KEY-----\n"}`
	gcp, _ := json.Marshal(map[string]string{"type": "gcp", "serviceAccountJson": key})
	for _, c := range []struct {
		raw  string
		want *oci.Credentials
		err  string
	}{
		{``, nil, ""},
		{`null`, nil, ""},
		{`{"type":"registry","username":"u","password":"secret-pw"}`, &oci.Credentials{Username: "u", Password: "secret-pw"}, ""},
		{string(gcp), &oci.Credentials{Username: "_json_key", Password: key}, ""},
		{`{"type":"registry","username":"u"}`, nil, "type registry needs username and password"},
		{`{"type":"registry","password":"secret-pw"}`, nil, "type registry needs username and password"},
		{`{"type":"gcp","serviceAccountJson":"secret-not-json"}`, nil, "type gcp needs serviceAccountJson"},
		{`{"type":"aws","awsAccessKeyId":"AKIAX","awsSecretAccessKey":"secret-aws","awsRegion":"eu-west-1"}`, nil, "fromImageRegistry.type aws: not supported; use type registry"},
		{`{"type":"azure","password":"secret-pw"}`, nil, "must be registry or gcp"},
		{`{"type":"registry","username":1,"password":"secret-pw"}`, nil, "not an object of type and credentials"},
		{`"secret-pw"`, nil, "not an object"},
	} {
		got, err := registryCredentials(json.RawMessage(c.raw))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "secret") {
				t.Errorf("%s: %v; want %q", c.raw, err, c.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(c.want) || (got != nil && *got != *c.want) {
			t.Errorf("%s: %v %v; want %v", c.raw, got, err, c.want)
		}
	}
}

package e2b

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// gcpKeyUser is the user name Google's registries take with a service
// account's JSON key as the password (Basic auth).
const gcpKeyUser = "_json_key"

// registryCredentials reads E2B's fromImageRegistry (FromImageRegistry, a
// union on type) as the credentials of the build's pull: nil when absent.
// "registry" is Basic (username, password); "gcp" is Basic with the
// service account's JSON key as the password of the user _json_key, as
// Google's registries take it; "aws" would need a call to Amazon's API
// for a token, which sandboxd does not make: the client can make it
// (aws ecr get-login-password) and send type registry instead. The
// templates service checks the values; no message here shows one.
func registryCredentials(raw json.RawMessage) (*oci.Credentials, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var r templatespec.WireRegistry
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, edge.Errorf(http.StatusBadRequest, "fromImageRegistry: not an object of type and credentials (registry: username, password; gcp: serviceAccountJson)")
	}
	switch r.Type {
	case "registry":
		if r.Username == "" || r.Password == "" {
			return nil, edge.Errorf(http.StatusBadRequest, "fromImageRegistry: type registry needs username and password")
		}
		return &oci.Credentials{Username: r.Username, Password: r.Password}, nil
	case "gcp":
		if !json.Valid([]byte(r.ServiceAccountJSON)) || !bytes.HasPrefix(bytes.TrimSpace([]byte(r.ServiceAccountJSON)), []byte("{")) {
			return nil, edge.Errorf(http.StatusBadRequest, "fromImageRegistry: type gcp needs serviceAccountJson, a service account's JSON key")
		}
		return &oci.Credentials{Username: gcpKeyUser, Password: r.ServiceAccountJSON}, nil
	case "aws":
		return nil, edge.Errorf(http.StatusBadRequest, "fromImageRegistry.type aws: not supported; use type registry with username AWS and the password `aws ecr get-login-password` prints")
	}
	return nil, edge.Errorf(http.StatusBadRequest, "fromImageRegistry.type: must be registry or gcp (aws: not supported)")
}

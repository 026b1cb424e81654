package templates

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"unicode"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/sealbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// KeyBytes is the length of the key that seals registry credentials
// (AES-256).
const KeyBytes = sealbox.KeyBytes

// Bounds of the credentials a build takes: far above real ones (a cloud
// access token is a few KiB, a service account key about 2), far below
// what would make a row or a request heavy.
const (
	maxUsernameBytes = 256
	maxSecretBytes   = 16 << 10
)

// sealedPrefix is how a sealed value starts (sealbox's format): AES-256-GCM, the
// template's id as additional data, base64 of nonce and ciphertext.
const sealedPrefix = "v1:"

// LoadOrCreateKey reads the key that seals registry credentials from path,
// a file of KeyBytes random bytes, creating it (mode 0600) when it does
// not exist. A file of another length or readable by others is an error:
// the credentials it protects are the users'.
func LoadOrCreateKey(path string) ([]byte, error) {
	key := make([]byte, KeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	switch {
	case err == nil:
		_, werr := f.Write(key)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			os.Remove(path)
			return nil, fmt.Errorf("templates: write the credentials key: %w", werr)
		}
		return key, nil
	case !errors.Is(err, fs.ErrExist):
		return nil, fmt.Errorf("templates: create the credentials key: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("templates: the credentials key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("templates: the credentials key %s is readable by others (mode %04o); make it 0600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("templates: read the credentials key: %w", err)
	}
	if len(b) != KeyBytes {
		return nil, fmt.Errorf("templates: the credentials key %s has %d bytes, want %d", path, len(b), KeyBytes)
	}
	return b, nil
}

// KeyFromSecret derives the key that seals registry credentials from a
// secret every node of a cluster shares (the cluster secret), so that any
// node can open what another sealed: HMAC-SHA256 of a label of its own,
// so that the key is not the secret, nor any other key made from it.
func KeyFromSecret(secret []byte) []byte {
	return sealbox.Derive(secret, "sandboxd templates: registry credentials key v1")
}

// sealer seals and opens a build's registry credentials under the server's
// key, bound to the template's id (a sealed value copied to another
// template's row does not open).
type sealer struct{ box *sealbox.Box }

func newSealer(key []byte) (*sealer, error) {
	if len(key) != KeyBytes {
		return nil, fmt.Errorf("templates: the credentials key has %d bytes, want %d", len(key), KeyBytes)
	}
	box, err := sealbox.New(key)
	if err != nil {
		return nil, err
	}
	return &sealer{box: box}, nil
}

// sealedCredentials is what is sealed: oci.Credentials' fields, which its
// own redaction keeps out of JSON's reach only by not being marshalled.
type sealedCredentials struct {
	Username      string `json:"u,omitempty"`
	Password      string `json:"p,omitempty"`
	RegistryToken string `json:"t,omitempty"`
}

func (s *sealer) seal(templateID string, c oci.Credentials) (string, error) {
	plain, err := json.Marshal(sealedCredentials{Username: c.Username, Password: c.Password, RegistryToken: c.RegistryToken})
	if err != nil {
		return "", err
	}
	defer clear(plain)
	return s.box.Seal(templateID, plain)
}

// errUnsealable: the sealed credentials do not open with this node's key
// (the key file was replaced, or the value is not this template's).
var errUnsealable = errors.New("templates: the sealed registry credentials do not open with this server's key")

func (s *sealer) open(templateID, sealed string) (oci.Credentials, error) {
	plain, err := s.box.Open(templateID, sealed)
	if err != nil {
		return oci.Credentials{}, errUnsealable
	}
	defer clear(plain)
	var c sealedCredentials
	dec := json.NewDecoder(bytes.NewReader(plain))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return oci.Credentials{}, errUnsealable
	}
	return oci.Credentials{Username: c.Username, Password: c.Password, RegistryToken: c.RegistryToken}, nil
}

// checkCredentials validates a build's registry credentials: a user name
// and password (or an access token used as the password), or a registry
// token alone; bounded; the user name printable and without ':' (Basic
// auth's separator).
func checkCredentials(c oci.Credentials) error {
	bad := func(msg string) error { return errdefs.New(errdefs.ErrInvalid, "registry: "+msg) }
	switch {
	case c == oci.Credentials{}:
		return bad("give a username and password, or a token")
	case c.IdentityToken != "":
		return bad("an identity token is not taken; give a username and password, or a token")
	case c.RegistryToken != "" && (c.Username != "" || c.Password != ""):
		return bad("give a username and password, or a token, not both")
	case c.RegistryToken != "":
		if len(c.RegistryToken) > maxSecretBytes {
			return bad(fmt.Sprintf("token: longer than %d bytes", maxSecretBytes))
		}
		if strings.ContainsFunc(c.RegistryToken, unicode.IsControl) || strings.ContainsRune(c.RegistryToken, ' ') {
			return bad("token: contains spaces or control characters")
		}
		return nil
	case c.Username == "":
		return bad("username: required with a password")
	case c.Password == "":
		return bad("password: required with a username")
	case len(c.Username) > maxUsernameBytes:
		return bad(fmt.Sprintf("username: longer than %d bytes", maxUsernameBytes))
	case strings.ContainsRune(c.Username, ':') || strings.ContainsFunc(c.Username, unicode.IsControl):
		return bad("username: contains ':' or control characters")
	case len(c.Password) > maxSecretBytes:
		return bad(fmt.Sprintf("password: longer than %d bytes", maxSecretBytes))
	case strings.ContainsRune(c.Password, 0):
		return bad("password: contains NUL")
	}
	return nil
}

// credentials opens the registry credentials of template id's build:
// zero (anonymous) when it has none. Credentials that do not open fail
// the build with a reason saying what to do.
func (s *Service) credentials(ctx context.Context, id string) (oci.Credentials, error) {
	sealed, err := s.st.GetTemplateCredentials(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return oci.Credentials{}, nil
	}
	if err != nil {
		return oci.Credentials{}, err
	}
	if s.sealer == nil {
		return oci.Credentials{}, errdefs.New(errdefs.ErrInvalid, "the build's registry credentials cannot be read: this server has no key for them; build again")
	}
	c, err := s.sealer.open(id, sealed)
	if err != nil {
		return oci.Credentials{}, errdefs.Wrap(errdefs.ErrInvalid, err, "the build's registry credentials cannot be read with this server's key (was it replaced?); build again")
	}
	return c, nil
}

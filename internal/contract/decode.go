package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
)

// MaxBodyBytes bounds JSON request bodies; file contents never travel in
// JSON (uploads name URLs, or use multipart with its own limit).
const MaxBodyBytes = 1 << 20

// object is a decoded JSON object whose fields are checked one by one, so
// that each failure names its field with the contract's message rather than
// a decoder's wording.
type object map[string]json.RawMessage

// ReadArgs decodes the request body as a JSON object. An empty body counts
// as {}.
func ReadArgs(w http.ResponseWriter, r *http.Request) (Args, error) {
	data, err := ReadRaw(w, r)
	if err != nil {
		return Args{}, err
	}
	return DecodeObject(data)
}

// ReadRaw reads the request's body, at most MaxBodyBytes.
func ReadRaw(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &edge.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("Request body must be at most %d bytes", MaxBodyBytes)}
		}
		return nil, ErrMalformed
	}
	return data, nil
}

func decodeObject(data []byte) (object, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return object{}, nil
	}
	if !json.Valid(data) {
		return nil, ErrMalformed
	}
	if data[0] != '{' {
		return nil, BadRequest("Request body must be a JSON object")
	}
	var o object
	if err := json.Unmarshal(data, &o); err != nil {
		return nil, ErrMalformed
	}
	if o == nil {
		o = object{}
	}
	return o, nil
}

// present reports whether the field is there and not null. Null counts as
// absent: clients that serialise unset optionals as null keep working.
func (o object) present(name string) bool {
	raw, ok := o[name]
	return ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// jsonKind names a JSON value's type the way the original API's validator
// worded type errors ("Expected string, received number").
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "undefined"
	}
	switch raw[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

func typeError(want string, raw json.RawMessage, path []any) *edge.Error {
	return FieldError(fmt.Sprintf("Expected %s, received %s", want, jsonKind(raw)), path...)
}

// str returns a string field; ok is false when it is absent.
func (o object) str(name string, path ...any) (s string, ok bool, err error) {
	if !o.present(name) {
		return "", false, nil
	}
	p := append(append([]any{}, path...), name)
	if err := json.Unmarshal(o[name], &s); err != nil {
		return "", false, typeError("string", o[name], p)
	}
	return s, true, nil
}

// envMap returns an object field of string values whose keys are
// variable names (non-empty, no '=' or NUL); nil when absent.
func (o object) envMap(name string) (map[string]string, error) {
	if !o.present(name) {
		return nil, nil
	}
	env, err := decodeObject(o[name])
	if err != nil || jsonKind(o[name]) != "object" {
		return nil, typeError("object", o[name], []any{name})
	}
	out := map[string]string{}
	for k := range env {
		v, _, err := env.str(k, name)
		if err != nil {
			return nil, err
		}
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, FieldError(name+" names must be non-empty and contain no '='", name, k)
		}
		out[k] = v
	}
	return out, nil
}

// strings returns a string-array field.
func (o object) strings(name string) ([]string, bool, error) {
	if !o.present(name) {
		return nil, false, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(o[name], &items); err != nil {
		return nil, false, typeError("array", o[name], []any{name})
	}
	out := make([]string, len(items))
	for i, raw := range items {
		if err := json.Unmarshal(raw, &out[i]); err != nil {
			return nil, false, typeError("string", raw, []any{name, i})
		}
	}
	return out, true, nil
}

// bool returns a boolean field.
func (o object) bool(name string) (b, ok bool, err error) {
	if !o.present(name) {
		return false, false, nil
	}
	if err := json.Unmarshal(o[name], &b); err != nil {
		return false, false, typeError("boolean", o[name], []any{name})
	}
	return b, true, nil
}

// int returns an integer field.
func (o object) int(name string) (int64, bool, error) {
	if !o.present(name) {
		return 0, false, nil
	}
	var f float64
	if err := json.Unmarshal(o[name], &f); err != nil {
		return 0, false, typeError("number", o[name], []any{name})
	}
	// Out of int64's range the conversion below is undefined (on amd64 it
	// gives math.MinInt64): refuse first.
	if f >= 0x1p63 || f < -0x1p63 {
		return 0, false, FieldError(name+" is out of range", name)
	}
	if f != float64(int64(f)) {
		return 0, false, FieldError("Expected integer, received float", name)
	}
	return int64(f), true, nil
}

// maxMillis is the longest duration in milliseconds that time.Duration
// holds (about 292 years); more would overflow into a negative lifetime
// that passes every "at most" check.
const maxMillis = int64(math.MaxInt64 / int64(time.Millisecond))

// millis returns a field that is a positive number of milliseconds that
// fits a time.Duration; required says whether it must be present.
func (o object) millis(name string, required bool) (int64, bool, error) {
	v, ok, err := o.int(name)
	switch {
	case err != nil:
		return 0, false, err
	case !ok && !required:
		return 0, false, nil
	case !ok || v <= 0:
		return 0, false, FieldError(name+" must be a positive number of milliseconds", name)
	case v > maxMillis:
		return 0, false, FieldError(fmt.Sprintf("%s must be at most %d milliseconds", name, maxMillis), name)
	}
	return v, true, nil
}

// objects returns an array-of-objects field.
func (o object) objects(name string) ([]object, bool, error) {
	if !o.present(name) {
		return nil, false, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(o[name], &items); err != nil {
		return nil, false, typeError("array", o[name], []any{name})
	}
	out := make([]object, len(items))
	for i, raw := range items {
		if jsonKind(raw) != "object" {
			return nil, false, typeError("object", raw, []any{name, i})
		}
		if err := json.Unmarshal(raw, &out[i]); err != nil {
			return nil, false, typeError("object", raw, []any{name, i})
		}
	}
	return out, true, nil
}

// accountID returns the optional account_id field, checked to be a UUID.
func (o object) accountID() (string, error) {
	s, ok, err := o.str("account_id")
	if err != nil || !ok {
		return "", err
	}
	if !auth.IsUUID(s) {
		return "", FieldError("account_id must be a valid UUID", "account_id")
	}
	return strings.ToLower(s), nil
}

// isHTTPURL reports whether s is an absolute http or https URL with a host.
func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	if err != nil {
		return false
	}
	return (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// actsFor is a request that may name the account it acts for.
type ActsFor interface{ ActingFor() string }

func (r CreateSandboxRequest) ActingFor() string  { return r.AccountID }
func (r PatchSandboxesRequest) ActingFor() string { return r.AccountID }
func (r AccountRequest) ActingFor() string        { return r.AccountID }
func (r CodingAgentRequest) ActingFor() string    { return r.AccountID }
func (r TimeoutRequest) ActingFor() string        { return r.AccountID }
func (r NetworkRequest) ActingFor() string        { return r.AccountID }
func (r ForkRequest) ActingFor() string           { return r.AccountID }
func (r ExecRequest) ActingFor() string           { return r.AccountID }
func (q ListSandboxesQuery) ActingFor() string    { return q.AccountID }
func (q FileQuery) ActingFor() string             { return q.AccountID }
func (q RunsQuery) ActingFor() string             { return q.AccountID }

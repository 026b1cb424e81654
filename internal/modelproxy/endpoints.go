package modelproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// endpoint is one method and path of a provider's API that sandboxes may
// call: inference only. Everything else a provider serves with the same key
// (files, batches, stored completions and responses, vector stores, the
// organization's keys and costs) is shared by every tenant of this server,
// so it is never forwarded.
type endpoint struct {
	method string
	// path is relative to the provider's base URL, in segments; an
	// anyID segment matches one segment (a model's id).
	path string
	// rewrite, when set, rewrites the JSON body before it is forwarded
	// (the body is then read whole, within the proxy's limit).
	rewrite func(body []byte) ([]byte, error)
}

// anyID in an endpoint's path matches one segment.
const anyID = "{id}"

// endpointsOf lists what sandboxes may call of a provider. Claude Code
// sends POST v1/messages (with ?beta=true) and v1/messages/count_tokens and
// reads the model list; OpenCode's OpenAI-compatible provider posts
// chat/completions and may list models.
func endpointsOf(provider string) []endpoint {
	switch provider {
	case Anthropic:
		return []endpoint{
			{method: http.MethodPost, path: "v1/messages"},
			{method: http.MethodPost, path: "v1/messages/count_tokens"},
			{method: http.MethodGet, path: "v1/models"},
			{method: http.MethodGet, path: "v1/models/" + anyID},
		}
	case OpenAI:
		return []endpoint{
			{method: http.MethodPost, path: "chat/completions", rewrite: chatCompletionsBody},
			{method: http.MethodPost, path: "completions", rewrite: completionsBody},
			{method: http.MethodPost, path: "embeddings"},
			{method: http.MethodGet, path: "models"},
			{method: http.MethodGet, path: "models/" + anyID},
		}
	}
	return nil
}

// describe lists the endpoints for an error message.
func describe(eps []endpoint) string {
	var b strings.Builder
	for i, ep := range eps {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ep.method + " " + ep.path)
	}
	return b.String()
}

// resolve finds the endpoint a request names: its method, and its path
// below /model/<provider>/ as it came on the wire (escaped). It returns
// the path to forward, relative to the base URL. Only a path spelled
// plainly matches: no empty, "." or ".." segment, no escape (%2F is not a
// slash), no character a model id does not need; the query string is
// forwarded as it is and takes no part in the choice.
func (u *upstream) resolve(method, rawPath string) (endpoint, string, bool) {
	segs, ok := segments(rawPath)
	if !ok {
		return endpoint{}, "", false
	}
	// An OpenAI-compatible API is configured with a base URL that may or
	// may not end in /v1, and its clients are configured either way too:
	// accept both spellings, and never send /v1/v1.
	versioned := false
	if u.name == OpenAI && len(segs) > 0 && segs[0] == "v1" {
		segs, versioned = segs[1:], true
	}
	for _, ep := range u.endpoints {
		if ep.method != method || !matches(ep.path, segs) {
			continue
		}
		path := strings.Join(segs, "/")
		if versioned && !strings.HasSuffix(u.base.Path, "/v1") {
			path = "v1/" + path
		}
		return ep, path, true
	}
	return endpoint{}, "", false
}

// segments splits an escaped path into its segments, refusing any that is
// not plain.
func segments(rawPath string) ([]string, bool) {
	if rawPath == "" {
		return nil, false
	}
	segs := strings.Split(rawPath, "/")
	for _, s := range segs {
		if s == "" || s == "." || s == ".." || strings.TrimFunc(s, plainRune) != "" {
			return nil, false
		}
	}
	return segs, true
}

// plainRune: the characters of API paths and model ids
// ("claude-sonnet-4-5", "ft:gpt-4o:org:x:id", "llama3.1:8b").
func plainRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._:@", r)
}

func matches(pattern string, segs []string) bool {
	want := strings.Split(pattern, "/")
	if len(want) != len(segs) {
		return false
	}
	for i, w := range want {
		if w != anyID && w != segs[i] {
			return false
		}
	}
	return true
}

// errBody is a request body an endpoint that rewrites it cannot read.
var errBody = errors.New("the request body must be a JSON object")

// chatCompletionsBody forces store to false: OpenAI keeps a completion
// asked with store: true where anyone holding the key lists and reads it,
// so another tenant's sandbox could. A client's true is replaced. A
// stream also asks for its usage (see includeUsage).
func chatCompletionsBody(body []byte) ([]byte, error) {
	obj, err := jsonObject(body)
	if err != nil {
		return nil, err
	}
	obj["store"] = json.RawMessage("false")
	if err := includeUsage(obj); err != nil {
		return nil, err
	}
	return marshalObject(obj)
}

// completionsBody asks a stream for its usage (see includeUsage).
func completionsBody(body []byte) ([]byte, error) {
	obj, err := jsonObject(body)
	if err != nil {
		return nil, err
	}
	if err := includeUsage(obj); err != nil {
		return nil, err
	}
	return marshalObject(obj)
}

// includeUsage sets stream_options.include_usage on a stream: an
// OpenAI-compatible stream reports its usage (in a last chunk) only when
// asked, and the daily token budget counts what streams report.
func includeUsage(obj map[string]json.RawMessage) error {
	var stream bool
	if json.Unmarshal(obj["stream"], &stream) != nil || !stream {
		return nil
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := obj["stream_options"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &opts); err != nil || opts == nil {
			return errors.New("stream_options must be an object")
		}
	}
	opts["include_usage"] = json.RawMessage("true")
	raw, err := marshalObject(opts)
	if err != nil {
		return err
	}
	obj["stream_options"] = raw
	return nil
}

func jsonObject(body []byte) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		return nil, errBody
	}
	return obj, nil
}

// marshalObject writes obj back as JSON, leaving its strings as they
// were (no HTML escaping).
func marshalObject(obj map[string]json.RawMessage) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return nil, fmt.Errorf("encode request body: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

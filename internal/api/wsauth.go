package api

import (
	"net/http"
	"strings"

	"github.com/sandboxd/sandboxd/internal/auth"
)

// keyProtocolPrefix starts the websocket subprotocol that carries an API
// key, `sandboxd.key.<KEY>`: a browser cannot set headers on a websocket,
// but it can offer subprotocols (new WebSocket(url, ["sandboxd.key." +
// key])). Only the API's own websocket routes take it (route.websocket);
// the proxy's websockets never do, since it forwards the handshake's
// headers to the sandbox.
const keyProtocolPrefix = "sandboxd.key."

// websocketKey is the API key a request to a websocket route presents:
// exactly one of x-api-key or Authorization: Bearer (auth.KeyFromHeaders)
// or, on the upgrade, a key subprotocol instead of both.
func websocketKey(r *http.Request) (string, error) {
	if isWebsocketUpgrade(r) {
		proto, n := keyProtocol(r)
		switch {
		case n > 1:
			return "", auth.ErrCredentials
		case n == 1:
			if len(r.Header.Values("x-api-key")) > 0 || len(r.Header.Values("Authorization")) > 0 {
				return "", auth.ErrCredentials
			}
			key := strings.TrimPrefix(proto, keyProtocolPrefix)
			if key == "" {
				return "", auth.ErrUnauthorized
			}
			return key, nil
		}
	}
	return auth.KeyFromHeaders(r.Header)
}

// keyProtocol returns the key subprotocol a websocket upgrade offers and
// how many it offers.
func keyProtocol(r *http.Request) (proto string, n int) {
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); strings.HasPrefix(p, keyProtocolPrefix) {
				proto, n = p, n+1
			}
		}
	}
	return proto, n
}

// isWebsocketUpgrade reports whether r asks to become a websocket
// (Connection: upgrade and Upgrade: websocket, RFC 6455 section 4.1).
func isWebsocketUpgrade(r *http.Request) bool {
	return headerHasToken(r.Header, "Connection", "upgrade") && headerHasToken(r.Header, "Upgrade", "websocket")
}

// headerHasToken reports whether a comma-separated header lists token,
// ignoring case.
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

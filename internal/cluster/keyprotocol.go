package cluster

import (
	"net/http"
	"strings"
)

// keyProtocolPrefix is the API's websocket subprotocol that carries a key
// (see package api): the key must not travel to the other node.
const keyProtocolPrefix = "sandboxd.key."

// stripKeyProtocol removes the key subprotocol from a websocket upgrade's
// offers and returns it.
func stripKeyProtocol(h http.Header) string {
	var keep []string
	var key string
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			p = strings.TrimSpace(p)
			if strings.HasPrefix(p, keyProtocolPrefix) {
				key = p
				continue
			}
			if p != "" {
				keep = append(keep, p)
			}
		}
	}
	if key == "" {
		return ""
	}
	h.Del("Sec-WebSocket-Protocol")
	if len(keep) > 0 {
		h.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
	}
	return key
}

// restoreKeyProtocol answers a websocket upgrade whose key subprotocol was
// stripped with that subprotocol, as this node would have: the client
// only accepts a subprotocol it offered, and it offered that one.
func restoreKeyProtocol(resp *http.Response) error {
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Request == nil {
		return nil
	}
	if proto, ok := resp.Request.Context().Value(ctxKeyProtocol).(string); ok && resp.Header.Get("Sec-WebSocket-Protocol") == "" {
		resp.Header.Set("Sec-WebSocket-Protocol", proto)
	}
	return nil
}

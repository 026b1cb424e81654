package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestCtrlCEverywhere: in an interactive shell over the exec websocket
// (what `sandboxd sandbox connect` runs), Ctrl-C — the byte 0x03 a
// terminal sends — interrupts the foreground job on every runtime, the
// fallback runsc included, and the shell lives on.
func TestCtrlCEverywhere(t *testing.T) {
	onEveryRuntime(t, func(t *testing.T, _ string, flags []string) {
		s := startServer(t, "", flags...)
		k := s.createKey(s.createAccount("typist", false).ID)
		id := s.createSandbox(k, map[string]any{"timeout": 300000})["sandboxId"].(string)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(s.base, "http")+"/api/sandboxes/"+id+"/exec",
			&websocket.DialOptions{Subprotocols: []string{"sandboxd.key." + k.Key}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		first, _ := json.Marshal(map[string]any{"command": "sh", "args": []string{"-i"}, "pty": map[string]any{"rows": 24, "cols": 80}})
		if err := c.Write(ctx, websocket.MessageText, first); err != nil {
			t.Fatal(err)
		}
		out := &syncBuffer{}
		exit := make(chan string, 1)
		go func() {
			for {
				typ, msg, err := c.Read(ctx)
				if err != nil {
					exit <- "read: " + err.Error()
					return
				}
				if typ == websocket.MessageBinary && len(msg) > 0 {
					out.Write(msg[1:])
					continue
				}
				exit <- string(msg)
				return
			}
		}()
		typ := func(s string) {
			t.Helper()
			if err := c.Write(ctx, websocket.MessageBinary, []byte(s)); err != nil {
				t.Fatal(err)
			}
		}
		typ("sleep 600\n")
		waitSleeping(t, s, k, id)
		typ("\x03")
		typ("echo after-$((6*7))\n")
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(out.String(), "after-42") {
			if time.Now().After(deadline) {
				t.Fatalf("Ctrl-C did not interrupt sleep: the shell never ran the next line; terminal:\n%s", out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		typ("exit 0\n")
		if got := <-exit; !strings.Contains(got, `"type":"exit"`) || !strings.Contains(got, `"exitCode":0`) {
			t.Fatalf("the shell's end: %s; terminal:\n%s", got, out.String())
		}
	})
}

// waitSleeping waits until a `sleep 600` process runs in sandbox id (the
// process itself, not a shell whose command line names it).
func waitSleeping(t *testing.T, s *server, k key, id string) {
	t.Helper()
	const find = `for f in /proc/[0-9]*/cmdline; do [ "$(tr '\0' ' ' < $f 2>/dev/null)" = "sleep 600 " ] && echo found; done; true`
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(shIn(t, s, k, id, find), "found") {
		if time.Now().After(deadline) {
			t.Fatal("sleep 600 never ran")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

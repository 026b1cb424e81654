package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
)

// adminKey creates an account called name with `sandboxd admin` (global
// its global flags: the data dir, the database) and answers an API key of
// it.
func adminKey(ctx context.Context, sandboxd, name string, global ...string) (string, error) {
	account, err := adminAccount(ctx, sandboxd, name, global...)
	if err != nil {
		return "", err
	}
	return adminKeyOf(ctx, sandboxd, account, "", global...)
}

// adminAccount creates an account called name and answers its id.
func adminAccount(ctx context.Context, sandboxd, name string, global ...string) (string, error) {
	var a struct {
		ID string `json:"id"`
	}
	err := admin(ctx, sandboxd, &a, global, "account", "create", "--name", name)
	return a.ID, err
}

// adminKeyOf creates a key of account, of format ("e2b", or "" for
// sandboxd's own), and answers it.
func adminKeyOf(ctx context.Context, sandboxd, account, format string, global ...string) (string, error) {
	args := []string{"key", "create", "--account", account}
	if format != "" {
		args = append(args, "--format", format)
	}
	var k struct {
		Key string `json:"key"`
	}
	err := admin(ctx, sandboxd, &k, global, args...)
	return k.Key, err
}

// admin runs `sandboxd admin ARGS GLOBAL --json` and decodes its answer.
func admin(ctx context.Context, sandboxd string, out any, global []string, args ...string) error {
	args = append(append(append([]string{"admin"}, args...), global...), "--json")
	b, err := exec.CommandContext(ctx, sandboxd, args...).Output()
	if err != nil {
		return fmt.Errorf("sandboxd %s: %w", strings.Join(args, " "), err)
	}
	return json.Unmarshal(b, out)
}

// callAPI sends body as JSON with key to base+path and decodes the answer
// into out (when not nil), reading at most limit bytes of it; an answer
// other than 2xx is an error naming its status and the end of its body.
func callAPI(ctx context.Context, hc *http.Client, base, key, method, path string, body, out any, limit int64) (int, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("x-api-key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, tail(string(b), 300))
	}
	if out != nil {
		return resp.StatusCode, json.Unmarshal(b, out)
	}
	return resp.StatusCode, nil
}

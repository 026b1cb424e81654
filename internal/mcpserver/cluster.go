package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// In a cluster, work that needs the runtime of the node hosting a sandbox
// (exec, stop) and the start of a sandbox placed on another node are done
// there: the tool sends that node the API request it stands for (POST
// /api/sandboxes/{id}/exec, .../stop, POST /api/sandboxes) through the gate
// (edge.Gate.Do: signed as a forward for the caller's key id), and answers
// what that node's API answered, so the result, the errors and the account
// rules are the host node's own. Everything else the tools do (runs, the
// repositories) every node serves from the shared database and store.

// maxNodeAnswer bounds a JSON answer read from another node (a sandbox,
// an error body): they are small, and a bound keeps a broken node from
// filling this one's memory.
const maxNodeAnswer = 1 << 20

// maxNodeEvent bounds one event of a streamed exec from another node: a
// piece of output as the host read it (the API's own CLI allows as much).
const maxNodeEvent = 4 << 20

// unreachable is the answer when node did not answer, the same as the
// API's when it forwards a request there.
func unreachable(node string) error {
	return &edge.Error{Status: http.StatusBadGateway, Msg: fmt.Sprintf("the node hosting this (%s) did not answer; try again shortly", node)}
}

// onNode sends the API request method path, with body as JSON, to node
// for caller p, and returns the response when it succeeded. Any other
// answer is returned as the API error it carries, as the host's API
// answered it.
func (h *Handler) onNode(ctx context.Context, node string, c edge.Caller, placed bool, method, path string, body any, accept string) (*http.Response, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode %s %s for node %s: %w", method, path, node, err)
	}
	req, err := http.NewRequestWithContext(ctx, method, path, bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("request %s %s for node %s: %w", method, path, node, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", accept)
	resp, err := h.opts.Gate.Do(req, c, node, placed)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, unreachable(node)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	var e contract.ErrorBody
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxNodeAnswer))
	if err == nil {
		err = json.Unmarshal(raw, &e)
	}
	if err != nil || e.Error == "" {
		// Not the API's error body: not something to show the caller.
		return nil, fmt.Errorf("%s %s on node %s: %d %q: %v", method, path, node, resp.StatusCode, raw, err)
	}
	return nil, &edge.Error{Status: resp.StatusCode, Msg: e.Error, Fields: e.MissingFields, Echo: e.Message != ""}
}

// callNode is onNode for a JSON answer, decoded into out.
func (h *Handler) callNode(ctx context.Context, node string, c edge.Caller, placed bool, method, path string, body, out any) error {
	resp, err := h.onNode(ctx, node, c, placed, method, path, body, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxNodeAnswer)).Decode(out); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("read the answer of node %s to %s %s: %w", node, method, path, err)
	}
	return nil
}

// sandboxPath is the API path of sandbox id's route op.
func sandboxPath(id, op string) string { return "/api/sandboxes/" + url.PathEscape(id) + "/" + op }

// execOn runs req in sandbox id on node, its host, through the streamed
// form of POST /api/sandboxes/{id}/exec: the output comes as the command
// writes it, into stdout and stderr, bounded here as the local exec's is.
func (h *Handler) execOn(ctx context.Context, node string, c edge.Caller, id string, req contract.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	resp, err := h.onNode(ctx, node, c, false, http.MethodPost, sandboxPath(id, "exec"), req, "text/event-stream")
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxNodeEvent)
	var event string
	for sc.Scan() {
		line := sc.Bytes()
		if name, ok := bytes.CutPrefix(line, []byte("event: ")); ok {
			event = string(name)
			continue
		}
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		// Every event's data decodes into the one value; the event's
		// name says which part is meant.
		var d struct {
			contract.ExecOutput
			contract.ExecExit
			contract.ExecFailure
		}
		if err := json.Unmarshal(data, &d); err != nil {
			return sandbox.ExecResult{}, fmt.Errorf("exec in %s on node %s: decode %s event: %w", id, node, event, err)
		}
		switch event {
		case "stdout":
			_, _ = io.WriteString(stdout, d.Data)
		case "stderr":
			_, _ = io.WriteString(stderr, d.Data)
		case "exit":
			return sandbox.ExecResult{ExitCode: d.ExitCode, OOMKilled: d.OOMKilled}, nil
		case "error":
			status := d.StatusCode
			if status == 0 {
				status = http.StatusInternalServerError
			}
			return sandbox.ExecResult{}, &edge.Error{Status: status, Msg: d.Error}
		}
	}
	if ctx.Err() != nil {
		return sandbox.ExecResult{}, ctx.Err()
	}
	// The stream ended without its last event: the host went away in the
	// middle of the command.
	h.log.WarnContext(ctx, "exec stream from node cut short", "node_id", node, "sandbox_id", id, "err", sc.Err())
	return sandbox.ExecResult{}, unreachable(node)
}

// createOn starts the sandbox and its run on node, where placement put it,
// through POST /api/sandboxes there, and returns its row.
func (h *Handler) createOn(ctx context.Context, node string, c edge.Caller, req contract.CreateSandboxRequest) (store.Sandbox, string, error) {
	var resp contract.SandboxesResponse
	if err := h.callNode(ctx, node, c, true, http.MethodPost, "/api/sandboxes", req, &resp); err != nil {
		return store.Sandbox{}, "", err
	}
	if len(resp.Sandboxes) != 1 {
		return store.Sandbox{}, "", fmt.Errorf("create on node %s: %d sandboxes in the answer, want 1", node, len(resp.Sandboxes))
	}
	view := resp.Sandboxes[0]
	sb, err := h.opts.Store.GetSandbox(ctx, view.SandboxID)
	if err != nil {
		return store.Sandbox{}, "", fmt.Errorf("get sandbox %s created on node %s: %w", view.SandboxID, node, err)
	}
	return sb, view.RunID, nil
}

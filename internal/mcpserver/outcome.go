package mcpserver

import (
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/store"
)

// A command that ran and exited non-zero is, for the REST API, a run that
// COMPLETED with its exit code in its output: the contract's. For an
// assistant a tool result is either a success or an error, and a failed
// command answered as a success reads as one. So the tools that run
// something answer isError when it did not succeed, with why first in the
// text, and the same result (the run, or the exec's output) as ever.

// runAnswer answers prompt_sandbox and run_command for a new sandbox.
func runAnswer(res runResult) (*mcp.CallToolResult, error) {
	out, err := jsonResult(res)
	if err != nil || !res.Finished {
		return out, err
	}
	if why := runFailure(res.Run); why != "" {
		markFailed(out, why)
	}
	return out, nil
}

// runFailure says why a finished run did not succeed; "" when it did.
func runFailure(run api.Run) string {
	var out struct {
		ExitCode *int `json:"exitCode"`
	}
	_ = json.Unmarshal(run.Output, &out)
	if run.Status == string(store.RunCompleted) {
		if out.ExitCode == nil || *out.ExitCode == 0 {
			return ""
		}
		return fmt.Sprintf("The run's command exited with code %d (run %s is COMPLETED; its output is below).", *out.ExitCode, run.ID)
	}
	why := fmt.Sprintf("Run %s ended %s", run.ID, run.Status)
	if out.ExitCode != nil {
		why += fmt.Sprintf(", exit code %d", *out.ExitCode)
	}
	if run.Error != nil && run.Error.Message != "" {
		why += ": " + run.Error.Message
	}
	return why + "."
}

// execAnswer answers run_command in a running sandbox.
func execAnswer(resp api.ExecResponse) (*mcp.CallToolResult, error) {
	out, err := jsonResult(resp)
	if err != nil || resp.ExitCode == 0 {
		return out, err
	}
	why := fmt.Sprintf("The command exited with code %d.", resp.ExitCode)
	if resp.OOMKilled {
		why = fmt.Sprintf("The command was killed for the sandbox's memory limit (exit code %d).", resp.ExitCode)
	}
	markFailed(out, why)
	return out, nil
}

// markFailed makes a result an error whose text starts with why, for the
// clients that show the model only the first text.
func markFailed(res *mcp.CallToolResult, why string) {
	res.IsError = true
	if len(res.Content) > 0 {
		if tc, ok := res.Content[0].(*mcp.TextContent); ok {
			tc.Text = why + "\n\n" + tc.Text
			return
		}
	}
	res.Content = append([]mcp.Content{&mcp.TextContent{Text: why}}, res.Content...)
}

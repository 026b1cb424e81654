package mcpserver

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/contract"
)

// TestRunOutcome: a finished run that did not succeed (a non-zero exit,
// though the run is COMPLETED, or a run that failed) is an error result
// whose text starts with why; a successful or unfinished one is not.
func TestRunOutcome(t *testing.T) {
	run := func(status, output string, errMsg string) contract.Run {
		r := contract.Run{ID: "run_1", Status: status, Output: json.RawMessage(output)}
		if errMsg != "" {
			r.Error = &contract.RunError{Message: errMsg}
		}
		return r
	}
	for _, tc := range []struct {
		name     string
		res      runResult
		isError  bool
		startsAs string
	}{
		{"exit 0", runResult{Run: run("COMPLETED", `{"exitCode":0,"stdout":"hi\n"}`, ""), Finished: true}, false, "{"},
		{"exit 3", runResult{Run: run("COMPLETED", `{"exitCode":3,"stdout":"out\n"}`, ""), Finished: true}, true, "The run's command exited with code 3 (run run_1 is COMPLETED"},
		{"missing command", runResult{Run: run("FAILED", `{"exitCode":127}`, "command not found"), Finished: true}, true, "Run run_1 ended FAILED, exit code 127: command not found."},
		{"timed out", runResult{Run: run("FAILED", `{"stdout":"so far"}`, "the sandbox reached its timeout after 1m0s"), Finished: true}, true, "Run run_1 ended FAILED: the sandbox reached its timeout after 1m0s."},
		{"crashed", runResult{Run: run("CRASHED", `null`, ""), Finished: true}, true, "Run run_1 ended CRASHED."},
		{"not finished", runResult{Run: run("EXECUTING", `null`, ""), Finished: false}, false, "{"},
	} {
		res, err := runAnswer(tc.res)
		if err != nil {
			t.Fatal(err)
		}
		text := res.Content[0].(*mcp.TextContent).Text
		if res.IsError != tc.isError || !strings.HasPrefix(text, tc.startsAs) || !strings.Contains(text, `"id": "run_1"`) || res.StructuredContent == nil {
			t.Errorf("%s: isError %v, text %q", tc.name, res.IsError, text)
		}
	}
	for _, tc := range []struct {
		resp     contract.ExecResponse
		isError  bool
		startsAs string
	}{
		{contract.ExecResponse{Status: "success", ExitCode: 0}, false, "{"},
		{contract.ExecResponse{Status: "success", ExitCode: 2, Stderr: "no such file\n"}, true, "The command exited with code 2.\n\n{"},
		{contract.ExecResponse{Status: "success", ExitCode: 137, OOMKilled: true}, true, "The command was killed for the sandbox's memory limit (exit code 137)."},
	} {
		res, err := execAnswer(tc.resp)
		if err != nil {
			t.Fatal(err)
		}
		if text := res.Content[0].(*mcp.TextContent).Text; res.IsError != tc.isError || !strings.HasPrefix(text, tc.startsAs) || len(res.Content) != 1 {
			t.Errorf("exit %d: isError %v, text %q", tc.resp.ExitCode, res.IsError, text)
		}
	}
}

package contract

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/guest/codeint"
)

// CodeRequest is the body of POST /api/sandboxes/{id}/code (sandboxd).
type CodeRequest struct {
	Code      string            `json:"code" jsonschema:"description=The code to run: a cell of the context's language"`
	Language  string            `json:"language,omitempty" jsonschema:"description=Run in the default context of this language (python when neither language nor contextId is given; js and ts are javascript and typescript): made on first use. Not with contextId"`
	ContextID string            `json:"contextId,omitempty" jsonschema:"description=Run in this context (POST .../code/contexts made it). Not with language"`
	Envs      map[string]string `json:"envs,omitempty" jsonschema:"description=Environment variables for this execution only: set before the cell and put back after it"`
	Timeout   int64             `json:"timeout,omitempty" jsonschema:"minimum=1,description=Milliseconds before the cell is interrupted (the context keeps its state and the answer's error is TimeoutError); default none beyond the sandbox's lifetime"`
	AccountID string            `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ActingFor implements ActsFor.
func (r CodeRequest) ActingFor() string { return r.AccountID }

// Interpreter is r as the code interpreter takes it.
func (r CodeRequest) Interpreter() codeint.ExecuteRequest {
	x := codeint.ExecuteRequest{Code: &r.Code, EnvVars: r.Envs, TimeoutMs: r.Timeout}
	switch {
	case r.ContextID != "":
		x.ContextID = &r.ContextID
	case r.Language != "":
		x.Language = &r.Language
	}
	return x
}

// maxCodeEnvs bounds the variables of one execution.
const maxCodeEnvs = 256

// ParseCode validates the body of POST /api/sandboxes/{id}/code.
func ParseCode(a Args) (CodeRequest, error) {
	o := a.o
	var req CodeRequest
	code, ok, err := o.str("code")
	if err != nil {
		return req, err
	}
	if !ok {
		return req, FieldError("code is required", "code")
	}
	req.Code = code
	if req.Language, _, err = o.str("language"); err != nil {
		return req, err
	}
	if req.ContextID, _, err = o.str("contextId"); err != nil {
		return req, err
	}
	if req.Language != "" && req.ContextID != "" {
		return req, FieldError("give language or contextId, not both", "contextId")
	}
	if req.Envs, err = o.envMap("envs"); err != nil {
		return req, err
	}
	if len(req.Envs) > maxCodeEnvs {
		return req, FieldError("at most 256 variables", "envs")
	}
	for k := range req.Envs {
		if !envName(k) {
			return req, FieldError("variable names are letters, digits and _, not starting with a digit", "envs", k)
		}
	}
	if req.Timeout, _, err = o.millis("timeout", false); err != nil {
		return req, err
	}
	req.AccountID, err = o.accountID()
	return req, err
}

func envName(k string) bool {
	if k == "" || k[0] >= '0' && k[0] <= '9' {
		return false
	}
	return strings.Trim(k, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == ""
}

// CodeContextRequest is the body of POST /api/sandboxes/{id}/code/contexts
// (sandboxd).
type CodeContextRequest struct {
	Language  string `json:"language,omitempty" jsonschema:"description=The kernel's language (default python); the sandbox's installed Jupyter kernels decide which exist: 400 names them"`
	Cwd       string `json:"cwd,omitempty" jsonschema:"description=The context's working directory, an absolute path (default the sandbox's commands' directory)"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ActingFor implements ActsFor.
func (r CodeContextRequest) ActingFor() string { return r.AccountID }

// ParseCodeContext validates the body of POST .../code/contexts.
func ParseCodeContext(a Args) (CodeContextRequest, error) {
	o := a.o
	var req CodeContextRequest
	var err error
	if req.Language, _, err = o.str("language"); err != nil {
		return req, err
	}
	if req.Cwd, _, err = o.str("cwd"); err != nil {
		return req, err
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return req, FieldError("cwd must be an absolute path", "cwd")
	}
	req.AccountID, err = o.accountID()
	return req, err
}

// CodeContext is a code context: a kernel of a sandbox, with its state.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// CodeContextsResponse answers GET .../code/contexts.
type CodeContextsResponse struct {
	Status   string        `json:"status" jsonschema:"enum=success"`
	Contexts []CodeContext `json:"contexts"`
}

// CodeContextResponse answers POST .../code/contexts.
type CodeContextResponse struct {
	Status  string      `json:"status" jsonschema:"enum=success"`
	Context CodeContext `json:"context"`
}

// CodeResponse answers a non-streamed POST .../code: E2B's Execution.
type CodeResponse struct {
	Status  string       `json:"status" jsonschema:"enum=success"`
	Results []CodeResult `json:"results"`
	Logs    CodeLogs     `json:"logs"`
	// Error is the exception the code raised (or TimeoutError), if any.
	Error          *CodeError `json:"error,omitempty"`
	ExecutionCount int        `json:"executionCount,omitempty"`
	// Truncated: output past the answer's bounds (1 MiB of logs, 32 MiB
	// of results) was left out; stream to see it all.
	Truncated  bool  `json:"truncated,omitempty"`
	DurationMs int64 `json:"durationMs"`
}

// CodeLogs are an execution's writes to stdout and stderr, in order.
type CodeLogs struct {
	Stdout []string `json:"stdout"`
	Stderr []string `json:"stderr"`
}

// CodeError is the error an execution raised.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// CodeResult is one result of an execution: each representation the kernel
// gave (E2B's field names), the value of the cell's last expression when
// isMainResult, else a display.
type CodeResult struct {
	Text       *string `json:"text,omitempty"`
	HTML       any     `json:"html,omitempty"`
	Markdown   any     `json:"markdown,omitempty"`
	SVG        any     `json:"svg,omitempty"`
	PNG        any     `json:"png,omitempty" jsonschema:"description=base64"`
	JPEG       any     `json:"jpeg,omitempty" jsonschema:"description=base64"`
	PDF        any     `json:"pdf,omitempty" jsonschema:"description=base64"`
	LaTeX      any     `json:"latex,omitempty"`
	JSON       any     `json:"json,omitempty"`
	JavaScript any     `json:"javascript,omitempty"`
	// Data is a pandas DataFrame's columns, Chart a matplotlib figure's
	// structure (E2B's chart types).
	Data         any            `json:"data,omitempty"`
	Chart        any            `json:"chart,omitempty"`
	Extra        map[string]any `json:"extra"`
	IsMainResult bool           `json:"is_main_result"`
}

// CodeResponseOf is an execution of the code interpreter as the REST API
// and MCP answer it.
func CodeResponseOf(x codeint.Execution, d time.Duration) CodeResponse {
	resp := CodeResponse{Status: "success", Logs: CodeLogs{Stdout: x.Logs.Stdout, Stderr: x.Logs.Stderr},
		ExecutionCount: x.ExecutionCount, Truncated: x.Truncated, DurationMs: d.Milliseconds(), Results: []CodeResult{}}
	if resp.Logs.Stdout == nil {
		resp.Logs.Stdout = []string{}
	}
	if resp.Logs.Stderr == nil {
		resp.Logs.Stderr = []string{}
	}
	if x.Error != nil {
		resp.Error = &CodeError{Name: x.Error.Name, Value: x.Error.Value, Traceback: x.Error.Traceback}
	}
	for _, r := range x.Results {
		resp.Results = append(resp.Results, codeResultOf(r))
	}
	return resp
}

// codeResultOf is r in the contract's shape.
func codeResultOf(r codeint.Result) CodeResult {
	raw := func(m json.RawMessage) any {
		if len(m) == 0 {
			return nil
		}
		return m
	}
	out := CodeResult{Text: r.Text, HTML: raw(r.HTML), Markdown: raw(r.Markdown), SVG: raw(r.SVG), PNG: raw(r.PNG),
		JPEG: raw(r.JPEG), PDF: raw(r.PDF), LaTeX: raw(r.LaTeX), JSON: raw(r.JSON), JavaScript: raw(r.JavaScript),
		Data: raw(r.Data), Chart: raw(r.Chart), Extra: map[string]any{}, IsMainResult: r.IsMainResult}
	for k, v := range r.Extra {
		out.Extra[k] = v
	}
	return out
}

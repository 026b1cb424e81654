package codeint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/guest"
)

// Target is the host's way to one sandbox's code interpreter: its agent's
// transport and who contexts run as there (the sandbox's commands' user,
// directory and environment).
type Target struct {
	Transport http.RoundTripper
	User, Dir string
	Env       []string
}

func (t Target) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+guest.CodePath+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if t.User != "" {
		req.Header.Set(guest.UserHeader, t.User)
	}
	if t.Dir != "" {
		req.Header.Set(guest.CodeDirHeader, t.Dir)
	}
	for _, kv := range t.Env {
		req.Header.Add(guest.CodeEnvHeader, kv)
	}
	resp, err := t.Transport.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("reach the sandbox's code interpreter: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		text := strings.TrimSpace(string(msg))
		switch resp.StatusCode {
		case http.StatusNotFound:
			return nil, errdefs.New(errdefs.ErrNotFound, text)
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return nil, errdefs.New(errdefs.ErrInvalid, text)
		}
		return nil, fmt.Errorf("code interpreter: %d %s", resp.StatusCode, text)
	}
	return resp, nil
}

// Execute runs req and calls fn with each output line, raw (E2B's JSON),
// and its type, until end_of_execution; fn's error stops it (and
// interrupts the cell). A stream that ends before end_of_execution is an
// error.
func (t Target) Execute(ctx context.Context, req ExecuteRequest, fn func(kind string, raw []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := t.do(ctx, http.MethodPost, PathExecute, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := readLine(br, maxEventLine)
		if err != nil {
			return fmt.Errorf("the code interpreter's stream ended early: %w", err)
		}
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(line, &head); err != nil {
			return fmt.Errorf("the code interpreter wrote a line that is not JSON: %w", err)
		}
		if err := fn(head.Type, line); err != nil {
			return err
		}
		if head.Type == LineEnd {
			return nil
		}
	}
}

// CreateContext starts a context of language in cwd ("" for the
// defaults).
func (t Target) CreateContext(ctx context.Context, language, cwd string) (Context, error) {
	var body CreateContextRequest
	if language != "" {
		body.Language = &language
	}
	if cwd != "" {
		body.Cwd = &cwd
	}
	var cx Context
	return cx, t.call(ctx, http.MethodPost, PathContexts, body, &cx)
}

// Warm starts the default context of language now (PathWarm).
func (t Target) Warm(ctx context.Context, language string) error {
	return t.call(ctx, http.MethodPost, PathWarm, CreateContextRequest{Language: &language}, nil)
}

// ListContexts lists the contexts of the target's user.
func (t Target) ListContexts(ctx context.Context) ([]Context, error) {
	var cs []Context
	return cs, t.call(ctx, http.MethodGet, PathContexts, nil, &cs)
}

// RestartContext restarts context id's kernel.
func (t Target) RestartContext(ctx context.Context, id string) error {
	return t.call(ctx, http.MethodPost, PathContexts+"/"+id+"/restart", nil, nil)
}

// RemoveContext stops context id's kernel and forgets it.
func (t Target) RemoveContext(ctx context.Context, id string) error {
	return t.call(ctx, http.MethodDelete, PathContexts+"/"+id, nil, nil)
}

func (t Target) call(ctx context.Context, method, path string, body, out any) error {
	if strings.ContainsAny(path, "?#") {
		return errdefs.New(errdefs.ErrInvalid, "not a context id")
	}
	resp, err := t.do(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
		return fmt.Errorf("the code interpreter's answer: %w", err)
	}
	return nil
}

// Execution is a whole execution's output, gathered (Collect): E2B's
// Execution, with the output bounded.
type Execution struct {
	Results        []Result `json:"results"`
	Logs           Logs     `json:"logs"`
	Error          *Error   `json:"error,omitempty"`
	ExecutionCount int      `json:"executionCount,omitempty"`
	// Truncated says output past the bounds was left out.
	Truncated bool `json:"truncated,omitempty"`
}

// Logs are an execution's stdout and stderr writes, in order.
type Logs struct {
	Stdout []string `json:"stdout"`
	Stderr []string `json:"stderr"`
}

// Error is the error an execution raised.
type Error struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// What Collect keeps of one execution: each stream's text, and results.
const (
	maxCollectedLog     = 1 << 20
	maxCollectedResults = 32 << 20
)

// Collector gathers an execution's lines into an Execution.
type Collector struct {
	X                   Execution
	logBytes, resultLen int
	logsCut             bool
}

// Add takes one line (Execute's fn).
func (c *Collector) Add(kind string, raw []byte) error {
	x := &c.X
	switch kind {
	case LineCount:
		var l Line
		if json.Unmarshal(raw, &l) == nil && l.ExecutionCount != nil {
			x.ExecutionCount = *l.ExecutionCount
		}
	case LineStdout, LineStderr:
		var l Line
		if json.Unmarshal(raw, &l) != nil || l.Text == nil {
			return nil
		}
		text := *l.Text
		if c.logsCut {
			return nil // nothing after the cut: the logs stay in order
		}
		if room := maxCollectedLog - c.logBytes; len(text) > room {
			// What fits is kept, cut at a character's start.
			x.Truncated, c.logsCut = true, true
			for room > 0 && !utf8.RuneStart(text[room]) {
				room--
			}
			text = text[:room]
		}
		if text == "" {
			return nil
		}
		c.logBytes += len(text)
		if kind == LineStdout {
			x.Logs.Stdout = append(x.Logs.Stdout, text)
		} else {
			x.Logs.Stderr = append(x.Logs.Stderr, text)
		}
	case LineResult:
		if c.resultLen+len(raw) > maxCollectedResults {
			x.Truncated = true
			return nil
		}
		var r Result
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("a result line: %w", err)
		}
		c.resultLen += len(raw)
		x.Results = append(x.Results, r)
	case LineError:
		var l Line
		if json.Unmarshal(raw, &l) == nil && l.Name != nil {
			x.Error = &Error{Name: *l.Name, Value: deref(l.Value), Traceback: deref(l.Traceback)}
		}
	}
	return nil
}

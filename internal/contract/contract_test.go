package contract

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/edge"
)

func TestIsBinary(t *testing.T) {
	cases := []struct {
		name string
		data []byte
		want bool
	}{
		{"a.txt", []byte("hello"), false},
		{"a.PNG", []byte("hello"), true},
		{"a.md", []byte{'a', 0, 'b'}, true},
		{"a.md", []byte{0xff, 0xfe}, true},
		{"a.md", []byte("héllo"), false},
	}
	for _, tc := range cases {
		if got := IsBinary(tc.name, tc.data); got != tc.want {
			t.Errorf("IsBinary(%q, %q) = %v", tc.name, tc.data, got)
		}
	}
}

// checkDecoded asserts the invariant of every decoder: bad input yields a
// client error with the contract's body, never a panic or a 500.
func checkDecoded(t *testing.T, err error) {
	if err == nil {
		return
	}
	e, ok := err.(*edge.Error)
	if !ok || e.Status < 400 || e.Status >= 500 || e.Msg == "" {
		t.Fatalf("decoder error %T %v", err, err)
	}
}

func FuzzCreateSandboxBody(f *testing.F) {
	for _, seed := range []string{``, `{}`, `{"command":"ls","args":["-la"],"cwd":"/tmp"}`, `{"command":""}`,
		`{"prompt":"x","command":"y"}`, `{"account_id":"6f1c0e2a-8b7d-4c1e-9a3f-2d5b6c7e8f90"}`, `{"timeout":1.5}`, `[1]`, `{"args":[1]}`,
		`{"volumes":[{"name":"a","path":"/a","read_only":true}]}`, `{"volumes":[{"name":1}]}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := DecodeObject(data)
		checkDecoded(t, err)
		if err == nil {
			_, err = ParseCreateSandbox(o)
			checkDecoded(t, err)
		}
	})
}

func FuzzUploadFilesBody(f *testing.F) {
	for _, seed := range []string{`{"files":[{"url":"https://a.test/x","name":"x"}]}`, `{"files":[]}`, `{"files":[{"url":1}]}`,
		`{"files":[{"url":"https://a.test/x","name":"../x"}],"path":"../../etc"}`, `{"files":"x"}`, `{"files":[null]}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := DecodeObject(data)
		checkDecoded(t, err)
		if err == nil {
			req, err := ParseUploadFiles(o)
			checkDecoded(t, err)
			// A component "..", not two dots in a name ("0.." is a file).
			if err == nil && (slices.Contains(strings.Split(req.Path, "/"), "..") || strings.HasPrefix(req.Path, "/")) {
				t.Fatalf("path escapes: %q", req.Path)
			}
		}
	})
}

func TestParseExecPTY(t *testing.T) {
	cases := []struct {
		body   string
		want   *PTYSize
		err    string
		fields string
	}{
		{body: `{"command":"sh","pty":{"rows":40,"cols":120}}`, want: &PTYSize{Rows: 40, Cols: 120}},
		{body: `{"command":"sh","pty":{"rows":1,"cols":1000}}`, want: &PTYSize{Rows: 1, Cols: 1000}},
		{body: `{"command":"sh"}`},
		{body: `{"command":"sh","pty":null}`},
		{body: `{"command":"sh","pty":{"rows":0,"cols":80}}`, err: "pty.rows must be between 1 and 1000", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":{"rows":24,"cols":1001}}`, err: "pty.cols must be between 1 and 1000", fields: "[pty cols]"},
		{body: `{"command":"sh","pty":{"rows":-5,"cols":80}}`, err: "pty.rows must be between 1 and 1000", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":{"rows":24}}`, err: "pty.cols must be between 1 and 1000", fields: "[pty cols]"},
		{body: `{"command":"sh","pty":{}}`, err: "pty.rows must be between 1 and 1000", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":{"rows":"24","cols":80}}`, err: "pty.rows must be an integer", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":{"rows":24.5,"cols":80}}`, err: "pty.rows must be an integer", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":true}`, err: "Expected object, received boolean", fields: "[pty]"},
		{body: `{"command":"sh","pty":[24,80]}`, err: "Expected object, received array", fields: "[pty]"},
	}
	for _, tc := range cases {
		o, err := DecodeObject([]byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		req, err := ParseExec(o)
		if tc.fields == "" {
			if err != nil || fmt.Sprint(req.PTY) != fmt.Sprint(tc.want) {
				t.Errorf("%s: pty %v, %v; want %v", tc.body, req.PTY, err, tc.want)
			}
			continue
		}
		var e *edge.Error
		if !errors.As(err, &e) || e.Status != 400 || fmt.Sprint(e.Fields) != tc.fields || e.Msg != tc.err {
			t.Errorf("%s: %+v, want 400 %q on %s", tc.body, err, tc.err, tc.fields)
		}
	}
}

// TestParsePause: a pause keeps the memory unless memory is false (the
// files alone); a memory that is not a boolean is refused, naming the
// field.
func TestParsePause(t *testing.T) {
	for body, want := range map[string]string{`{}`: "<nil>", `{"memory":true}`: "true", `{"memory":false}`: "false", `{"memory":"no"}`: "refused"} {
		o, err := DecodeObject([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		req, err := ParsePause(o)
		var e *edge.Error
		got := "<nil>"
		switch {
		case errors.As(err, &e) && e.Status == 400 && fmt.Sprint(e.Fields) == "[memory]":
			got = "refused"
		case err != nil:
			got = err.Error()
		case req.Memory != nil:
			got = fmt.Sprint(*req.Memory)
		}
		if got != want {
			t.Errorf("%s: %s, want %s", body, got, want)
		}
	}
}

// TestParseOnTimeout: on_timeout is stop (none), pause or pause-files;
// anything else is refused naming the field.
func TestParseOnTimeout(t *testing.T) {
	for body, want := range map[string]string{`{}`: "", `{"on_timeout":"stop"}`: "", `{"on_timeout":"pause"}`: "pause",
		`{"on_timeout":"pause-files"}`: "pause-files", `{"on_timeout":"sleep"}`: "refused", `{"on_timeout":1}`: "refused"} {
		o, err := DecodeObject([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		req, err := ParseCreateSandbox(o)
		got := req.OnTimeout
		var e *edge.Error
		if errors.As(err, &e) && e.Status == 400 && fmt.Sprint(e.Fields) == "[on_timeout]" {
			got = "refused"
		} else if err != nil {
			got = err.Error()
		}
		if got != want {
			t.Errorf("%s: %q, want %q", body, got, want)
		}
	}
}

package api

import (
	"errors"
	"fmt"
	"testing"
)

func TestParseExecPTY(t *testing.T) {
	cases := []struct {
		body   string
		want   *PTYSize
		err    string
		fields string
	}{
		{body: `{"command":"sh","pty":{"rows":40,"cols":120}}`, want: &PTYSize{Rows: 40, Cols: 120}},
		{body: `{"command":"sh"}`},
		{body: `{"command":"sh","pty":{"rows":0,"cols":80}}`, err: "pty.rows must be between 1 and 1000", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":{"rows":24,"cols":1001}}`, err: "pty.cols must be between 1 and 1000", fields: "[pty cols]"},
		{body: `{"command":"sh","pty":{"rows":24}}`, err: "pty.cols must be between 1 and 1000", fields: "[pty cols]"},
		{body: `{"command":"sh","pty":{"rows":"24","cols":80}}`, err: "pty.rows must be an integer", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":true}`, fields: "[pty]"},
	}
	for _, tc := range cases {
		o, err := decodeObject([]byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		req, err := parseExec(o)
		if tc.fields == "" {
			if err != nil || fmt.Sprint(req.PTY) != fmt.Sprint(tc.want) {
				t.Errorf("%s: pty %v, %v; want %v", tc.body, req.PTY, err, tc.want)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || fmt.Sprint(e.Fields) != tc.fields || (tc.err != "" && e.Msg != tc.err) {
			t.Errorf("%s: %+v, want 400 %q on %s", tc.body, err, tc.err, tc.fields)
		}
	}
}

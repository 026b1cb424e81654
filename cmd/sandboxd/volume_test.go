package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
)

// volumeAPI answers the volume routes as the contract does: alice's data
// (mounted read-only in sbx_1) and its fork copy; vol_busy is mounted
// read-write and refused.
type volumeAPI struct {
	mu       sync.Mutex
	requests []string
}

func volJSON(id, name string, sizeMB int, attachments, forkedFrom string) string {
	return fmt.Sprintf(`{"id":%q,"name":%q,"size_mb":%d,"attachments":[%s],"forked_from":%q,"microvm_written":false,"created_at":"2026-01-02T03:04:05.000Z","updated_at":"2026-01-02T03:04:05.000Z"}`,
		id, name, sizeMB, attachments, forkedFrom)
}

const roMount = `{"sandbox_id":"sbx_1","path":"/data","read_only":true}`

func (a *volumeAPI) handler() http.Handler {
	mux := http.NewServeMux()
	answer := func(code int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			io.WriteString(w, body)
		}
	}
	data := volJSON("vol_data", "data", 1024, roMount, "")
	mux.HandleFunc("POST /api/volumes", answer(200, `{"status":"success","volume":`+volJSON("vol_new", "new", 2048, "", "")+`}`))
	mux.HandleFunc("GET /api/volumes", answer(200, `{"status":"success","volumes":[`+data+`,`+volJSON("vol_copy", "copy", 1024, "", "vol_data")+`]}`))
	mux.HandleFunc("GET /api/volumes/data", answer(200, `{"status":"success","volume":`+data+`}`))
	mux.HandleFunc("DELETE /api/volumes/copy", answer(200, `{"status":"success","volume":`+volJSON("vol_copy", "copy", 1024, "", "vol_data")+`}`))
	mux.HandleFunc("DELETE /api/volumes/vol_busy", answer(409, `{"status":"error","error":"volume \"busy\" is attached read-write to sandbox sbx_2"}`))
	mux.HandleFunc("PATCH /api/volumes/data", answer(200, `{"status":"success","volume":`+strings.Replace(data, `"size_mb":1024`, `"size_mb":4096`, 1)+`}`))
	mux.HandleFunc("POST /api/volumes/data/fork", answer(200, `{"status":"success","volume":`+volJSON("vol_fork", "before", 1024, "", "vol_data")+`}`))
	mux.HandleFunc("POST /api/sandboxes", answer(200, `{"status":"success","sandboxes":[{"sandboxId":"sbx_3","sandboxStatus":"running","timeout":1000,"createdAt":"2026-01-02T03:04:05Z"}]}`))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.requests = append(a.requests, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+string(body)))
		a.mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		mux.ServeHTTP(w, r)
	})
}

func (a *volumeAPI) last() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.requests) == 0 {
		return ""
	}
	return a.requests[len(a.requests)-1]
}

func newVolumeAPI(t *testing.T) *volumeAPI {
	a := &volumeAPI{}
	srv := httptest.NewServer(a.handler())
	t.Cleanup(srv.Close)
	for _, k := range []string{"SANDBOXD_JSON", "SANDBOXD_ACCOUNT", "SANDBOXD_SIZE_MB", "SANDBOXD_VOLUME"} {
		t.Setenv(k, "")
	}
	t.Setenv("SANDBOXD_URL", srv.URL)
	t.Setenv("SANDBOXD_API_KEY", "sbx_k")
	return a
}

// TestVolumeCommands: each volume command sends its route's request and
// prints a table, or the API's objects with --json; rm goes on past a
// refusal and exits 1.
func TestVolumeCommands(t *testing.T) {
	a := newVolumeAPI(t)
	const header = "ID        NAME  SIZE      MOUNTED         FORKED FROM  CREATED\n"
	for _, c := range []struct {
		args        []string
		request     string
		out, errOut string
		err         string
	}{
		{[]string{"create", "new", "--size-mb", "2048"}, `POST /api/volumes {"name":"new","size_mb":2048}`,
			"ID       NAME  SIZE      MOUNTED  FORKED FROM  CREATED\nvol_new  new   2048 MiB  -        -            2026-01-02T03:04:05.000Z\n", "", ""},
		{[]string{"create", "new", "--account", "acct"}, `POST /api/volumes {"name":"new","account_id":"acct"}`, "", "", ""},
		{[]string{"ls"}, "GET /api/volumes",
			header +
				"vol_data  data  1024 MiB  sbx_1:/data:ro  -            2026-01-02T03:04:05.000Z\n" +
				"vol_copy  copy  1024 MiB  -               vol_data     2026-01-02T03:04:05.000Z\n", "", ""},
		{[]string{"ls", "--account", "acct"}, "GET /api/volumes?account_id=acct", "", "", ""},
		{[]string{"inspect", "data"}, "GET /api/volumes/data",
			header + "vol_data  data  1024 MiB  sbx_1:/data:ro  -            2026-01-02T03:04:05.000Z\n", "", ""},
		{[]string{"resize", "data", "--size-mb", "4096"}, `PATCH /api/volumes/data {"size_mb":4096}`,
			header + "vol_data  data  4096 MiB  sbx_1:/data:ro  -            2026-01-02T03:04:05.000Z\n", "", ""},
		{[]string{"resize", "data"}, "", "", "", "--size-mb is required"},
		{[]string{"fork", "data", "before"}, `POST /api/volumes/data/fork {"name":"before"}`,
			"ID        NAME    SIZE      MOUNTED  FORKED FROM  CREATED\nvol_fork  before  1024 MiB  -        vol_data     2026-01-02T03:04:05.000Z\n", "", ""},
		{[]string{"rm", "vol_busy", "copy"}, "DELETE /api/volumes/copy", "vol_copy\n",
			"sandboxd: rm vol_busy: HTTP 409: volume \"busy\" is attached read-write to sandbox sbx_2\n", "command exited with status 1"},
		{[]string{"fork", "data"}, "", "", "", "accepts 2 arg(s), received 1"},
	} {
		before := a.last()
		out, errOut, cmd, err := runRoot(t, append([]string{"volume"}, c.args...)...)
		var gotErr string
		if err != nil {
			gotErr = err.Error()
			var exit *exitError
			if !errors.As(err, &exit) {
				reportError(cmd.ErrOrStderr(), err, false) // as main would
			}
		}
		req := a.last()
		if c.request == "" && req != before {
			t.Errorf("%q sent %q", c.args, req)
		}
		if c.request != "" && req != c.request {
			t.Errorf("%q sent %q, want %q", c.args, req, c.request)
		}
		if c.out != "" && out != c.out {
			t.Errorf("%q printed\n%s\nwant\n%s", c.args, out, c.out)
		}
		if c.errOut != "" && errOut != c.errOut {
			t.Errorf("%q stderr %q, want %q", c.args, errOut, c.errOut)
		}
		if !strings.Contains(gotErr, c.err) || (c.err == "") != (gotErr == "") {
			t.Errorf("%q: error %q, want %q", c.args, gotErr, c.err)
		}
	}

	// --json: the API's objects, one for one volume, an array for lists.
	out, _, _, err := runRoot(t, "volume", "inspect", "--json", "data")
	var one struct {
		ID          string
		Attachments []struct {
			SandboxID string `json:"sandbox_id"`
			ReadOnly  bool   `json:"read_only"`
		}
	}
	if err != nil || json.Unmarshal([]byte(out), &one) != nil || one.ID != "vol_data" || len(one.Attachments) != 1 || !one.Attachments[0].ReadOnly {
		t.Errorf("inspect --json: %v %s", err, out)
	}
	for _, args := range [][]string{{"ls", "--json"}, {"rm", "--json", "copy"}} {
		out, _, _, err := runRoot(t, append([]string{"volume"}, args...)...)
		var list []map[string]any
		if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) == 0 || list[0]["size_mb"] != 1024.0 {
			t.Errorf("%q: %v %s", args, err, out)
		}
	}
	_, errOut, _, err := runRoot(t, "volume", "rm", "--json", "vol_busy")
	if err == nil || !strings.Contains(errOut, `"status":409`) {
		t.Errorf("rm --json refused: %v %q", err, errOut)
	}
}

// TestCreateWithVolumes: sandbox create --volume sends each mount, read-
// only with :ro; a malformed one is refused before any request.
func TestCreateWithVolumes(t *testing.T) {
	a := newVolumeAPI(t)
	if _, _, _, err := runRoot(t, "sandbox", "create", "--volume", "data:/data", "--volume", "vol_2:/models/v1:ro", "--volume", "x:/x:rw"); err != nil ||
		a.last() != `POST /api/sandboxes {"volumes":[{"name":"data","path":"/data"},{"name":"vol_2","path":"/models/v1","read_only":true},{"name":"x","path":"/x"}]}` {
		t.Errorf("create --volume: %v %q", err, a.last())
	}
	for _, bad := range []string{"data", "data:", ":/data", "data:data", "data:/data:rx"} {
		before := a.last()
		_, _, _, err := runRoot(t, "sandbox", "create", "--volume", bad)
		if err == nil || !strings.Contains(err.Error(), "--volume") || a.last() != before {
			t.Errorf("--volume %q: %v, sent %q", bad, err, a.last())
		}
	}
}

// TestCompleteVolumes: the shell completes volume names from the API, for
// the first argument of a volume command and the NAME of --volume.
func TestCompleteVolumes(t *testing.T) {
	newVolumeAPI(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"volume", "inspect", "d"}, "data\t1024 MiB, sbx_1:/data:ro\n:4\n"},
		{[]string{"volume", "rm", "data", ""}, "copy\t1024 MiB, -\n:4\n"},
		{[]string{"volume", "fork", "data", ""}, ":4\n"},
		{[]string{"sandbox", "create", "--volume", "co"}, "copy:\t1024 MiB, -\n:6\n"},
	} {
		out, _, _, err := runRoot(t, append([]string{cobra.ShellCompRequestCmd}, c.args...)...)
		if got, _, _ := strings.Cut(out, "Completion ended"); err != nil || got != c.want {
			t.Errorf("complete %q: %v %q, want %q", c.args, err, out, c.want)
		}
	}
}

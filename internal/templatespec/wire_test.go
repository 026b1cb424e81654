package templatespec

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

const hashA = "9f2c1a0e5d0b7c6a4e3f2d1c0b9a8f7e6d5c4b3a29180706f5e4d3c2b1a09f8e"

// sdkBody is what E2B's JS SDK sends for
//
//	Template().fromImage('python:3', {username, password})
//	  .aptInstall('curl').copy('app/', '/app/', {user: 'user', mode: 0o755})
//	  .setEnvs({A: '1', B: '$A-x'}).setWorkdir('/app').setUser('user')
//	  .setStartCmd('python -m http.server 8000', waitForPort(8000))
//
// including the fields of its Instruction that the spec does not list.
const sdkBody = `{
  "startCmd": "python -m http.server 8000",
  "readyCmd": "[ -n \"$(ss -Htuln sport = :8000)\" ]",
  "steps": [
    {"type": "RUN", "args": ["apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y curl", "root"], "force": false},
    {"type": "COPY", "args": ["app/", "/app/", "user", "0755"], "force": false, "filesHash": "` + hashA + `", "resolveSymlinks": false, "gzip": true},
    {"type": "ENV", "args": ["A", "1", "B", "$A-x"], "force": false},
    {"type": "WORKDIR", "args": ["/app"], "force": false},
    {"type": "USER", "args": ["user"], "force": true}
  ],
  "force": false,
  "fromImage": "python:3",
  "fromImageRegistry": {"type": "registry", "username": "me", "password": "s3cret"}
}`

func TestFromJSONTheSDKsBody(t *testing.T) {
	got, err := FromJSON([]byte(sdkBody), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := &Template{
		Base: Base{Kind: BaseImage, Ref: "python:3", Auth: &RegistryAuth{Kind: AuthBasic, Username: "me", Password: "s3cret"}},
		Steps: []Step{
			{Kind: StepRun, Command: "apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y curl", User: "root"},
			{Kind: StepCopy, Src: "app/", Dest: "/app/", User: "user", Mode: 0o755, FilesHash: hashA},
			{Kind: StepEnv, Env: []EnvVar{{"A", "1"}, {"B", "$A-x"}}},
			{Kind: StepWorkdir, Path: "/app"},
			{Kind: StepUser, User: "user", Force: true},
		},
		StartCmd: "python -m http.server 8000",
		ReadyCmd: `[ -n "$(ss -Htuln sport = :8000)" ]`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%+v\nwant\n%+v", got, want)
	}

	// And back: the wire maps onto the Template without loss.
	back, err := json.Marshal(got.ToWire())
	if err != nil {
		t.Fatal(err)
	}
	again, err := FromJSON(back, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, got) {
		t.Errorf("round trip\n%+v\nwant\n%+v", again, got)
	}
}

func TestFromJSONBasesAndCredentials(t *testing.T) {
	tests := []struct {
		body string
		want Base
	}{
		{`{"fromTemplate": "base", "steps": []}`, Base{Kind: BaseTemplate, Ref: "base"}},
		{`{"fromImage": "x", "fromImageRegistry": {"type": "aws", "awsAccessKeyId": "k", "awsSecretAccessKey": "s", "awsRegion": "eu-west-1"}}`,
			Base{Kind: BaseImage, Ref: "x", Auth: &RegistryAuth{Kind: AuthAWS, AWSAccessKeyID: "k", AWSSecretAccessKey: "s", AWSRegion: "eu-west-1"}}},
		{`{"fromImage": "x", "fromImageRegistry": {"type": "gcp", "serviceAccountJson": "{\"a\":1}"}}`,
			Base{Kind: BaseImage, Ref: "x", Auth: &RegistryAuth{Kind: AuthGCP, GCPServiceAccountJSON: `{"a":1}`}}},
	}
	for _, tt := range tests {
		got, err := FromJSON([]byte(tt.body), Limits{})
		if err != nil {
			t.Errorf("%s: %v", tt.body, err)
			continue
		}
		if !reflect.DeepEqual(got.Base, tt.want) {
			t.Errorf("%s: base %+v, want %+v", tt.body, got.Base, tt.want)
		}
	}
}

func TestFromJSONStepForms(t *testing.T) {
	got, err := FromJSON([]byte(`{"fromImage": "x", "steps": [
		{"type": "run", "args": ["make"]},
		{"type": "ADD", "args": ["a", "b"], "filesHash": "`+hashA+`"},
		{"type": "COPY", "args": ["a", "b", "", ""], "filesHash": "`+hashA+`"},
		{"type": "ARG", "args": ["V", "1"]}
	]}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Step{
		{Kind: StepRun, Command: "make"},
		{Kind: StepCopy, Src: "a", Dest: "b", FilesHash: hashA},
		{Kind: StepCopy, Src: "a", Dest: "b", FilesHash: hashA},
		{Kind: StepArg, Env: []EnvVar{{"V", "1"}}},
	}
	if !reflect.DeepEqual(got.Steps, want) {
		t.Errorf("steps %+v, want %+v", got.Steps, want)
	}
}

func TestFromJSONRefused(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"not JSON", `{"fromImage": `, "not valid JSON"},
		{"wrong type", `{"fromImage": "x", "steps": [{"type": "RUN", "args": [1]}]}`, "steps.args must be a string, not number"},
		{"no base", `{"steps": []}`, "fromImage or fromTemplate is required"},
		{"two bases", `{"fromImage": "a", "fromTemplate": "b"}`, "give one base, not both"},
		{"registry type", `{"fromImage": "a", "fromImageRegistry": {"type": "ftp"}}`, `fromImageRegistry.type "ftp"`},
		{"registry no password", `{"fromImage": "a", "fromImageRegistry": {"type": "registry", "username": "u"}}`, "fromImage, fromImageRegistry: registry credentials (basic): password is empty"},
		{"credentials for a template", `{"fromTemplate": "a", "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}}`, "are for an image base"},
		{"image with spaces", `{"fromImage": "py thon"}`, "fromImage: base image"},
		{"unknown type", `{"fromImage": "a", "steps": [{"type": "HEALTHCHECK", "args": []}]}`, `steps[0].type "HEALTHCHECK" is not one of`},
		{"RUN arity", `{"fromImage": "a", "steps": [{"type": "RUN", "args": []}]}`, "steps[0].args: RUN takes [command] or [command, user], got 0"},
		{"RUN empty", `{"fromImage": "a", "steps": [{"type": "RUN", "args": ["  "]}]}`, "steps[0] (RUN): the command is empty"},
		{"RUN bad user", `{"fromImage": "a", "steps": [{"type": "RUN", "args": ["x", "a:b:c"]}]}`, "steps[0] (RUN): the user \"a:b:c\" is not user[:group]"},
		{"COPY no hash", `{"fromImage": "a", "steps": [{"type": "COPY", "args": ["a", "b"]}]}`, "steps[0].filesHash: a COPY needs"},
		{"COPY bad hash", `{"fromImage": "a", "steps": [{"type": "COPY", "args": ["a", "b"], "filesHash": "../../etc"}]}`, "not 64 lower-case hex digits"},
		{"COPY bad mode", `{"fromImage": "a", "steps": [{"type": "COPY", "args": ["a", "b", "", "rwx"], "filesHash": "` + hashA + `"}]}`, `steps[0].args[3]: mode "rwx" is not an octal number`},
		{"COPY big mode", `{"fromImage": "a", "steps": [{"type": "COPY", "args": ["a", "b", "", "177777"], "filesHash": "` + hashA + `"}]}`, "more than permission bits"},
		{"COPY absolute", `{"fromImage": "a", "steps": [{"type": "COPY", "args": ["/etc/passwd", "b"], "filesHash": "` + hashA + `"}]}`, "steps[0] (COPY): the source \"/etc/passwd\" is absolute"},
		{"COPY climbs", `{"fromImage": "a", "steps": [{"type": "COPY", "args": ["a/../../x", "b"], "filesHash": "` + hashA + `"}]}`, "climbs out"},
		{"ENV odd", `{"fromImage": "a", "steps": [{"type": "ENV", "args": ["A"]}]}`, "in pairs, got 1"},
		{"ENV name", `{"fromImage": "a", "steps": [{"type": "ENV", "args": ["A=B", "c"]}]}`, "must not contain '='"},
		{"ENV NUL", `{"fromImage": "a", "steps": [{"type": "ENV", "args": ["A", "b\u0000"]}]}`, "contains NUL"},
		{"WORKDIR arity", `{"fromImage": "a", "steps": [{"type": "WORKDIR", "args": ["a", "b"]}]}`, "WORKDIR takes [path], got 2"},
		{"USER empty", `{"fromImage": "a", "steps": [{"type": "USER", "args": [""]}]}`, "steps[0] (USER): the user is empty"},
		{"startCmd NUL", `{"fromImage": "a", "startCmd": "a\u0000"}`, "startCmd contains NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := FromJSON([]byte(tt.body), Limits{})
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("error %v, want ErrInvalid", err)
			}
			if !strings.Contains(msg(err), tt.want) {
				t.Errorf("message %q does not say %q", msg(err), tt.want)
			}
		})
	}
}

func TestFromJSONBounds(t *testing.T) {
	lim := Limits{JSONBytes: 2000, Steps: 3, EnvVars: 2, EnvValueBytes: 10, CommandBytes: 20, FieldBytes: 30}
	run := func(n int) string {
		return `{"fromImage": "a", "steps": [` + strings.TrimSuffix(strings.Repeat(`{"type": "RUN", "args": ["x"]},`, n), ",") + `]}`
	}
	tests := []struct {
		name, body string
		class      error
		want       string
	}{
		{"body", `{"fromImage": "` + strings.Repeat("a", 2000) + `"}`, errdefs.ErrTooLarge, "the limit is 2000"},
		{"steps", run(4), errdefs.ErrInvalid, "steps: 4 steps, the limit is 3"},
		{"command", `{"fromImage": "a", "steps": [{"type": "RUN", "args": ["` + strings.Repeat("y", 21) + `"]}]}`, errdefs.ErrInvalid, "the command is 21 bytes, the limit is 20"},
		{"start command", `{"fromImage": "a", "startCmd": "` + strings.Repeat("y", 21) + `"}`, errdefs.ErrInvalid, "startCmd is 21 bytes"},
		{"env value", `{"fromImage": "a", "steps": [{"type": "ENV", "args": ["A", "` + strings.Repeat("v", 11) + `"]}]}`, errdefs.ErrInvalid, "the value is 11 bytes, the limit is 10"},
		{"env vars across steps", `{"fromImage": "a", "steps": [{"type": "ENV", "args": ["A", "1", "B", "2"]}, {"type": "ARG", "args": ["C", "3"]}]}`, errdefs.ErrInvalid, "steps[1] (ARG): the template sets more than 2 variables"},
		{"path", `{"fromImage": "a", "steps": [{"type": "WORKDIR", "args": ["/` + strings.Repeat("d", 30) + `"]}]}`, errdefs.ErrInvalid, "the directory is 31 bytes, the limit is 30"},
		{"image", `{"fromImage": "` + strings.Repeat("i", 31) + `"}`, errdefs.ErrInvalid, "base image is 31 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := FromJSON([]byte(tt.body), lim)
			if !errors.Is(err, tt.class) {
				t.Fatalf("error %v, want class %v", err, tt.class)
			}
			if !strings.Contains(msg(err), tt.want) {
				t.Errorf("message %q does not say %q", msg(err), tt.want)
			}
		})
	}
	if _, err := FromJSON([]byte(run(3)), lim); err != nil {
		t.Errorf("at the step limit: %v", err)
	}
}

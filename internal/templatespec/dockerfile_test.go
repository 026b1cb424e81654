package templatespec

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

func parse(t *testing.T, df string, opts ParseOptions) *Template {
	t.Helper()
	tpl, err := ParseDockerfile([]byte(df), opts)
	if err != nil {
		t.Fatalf("ParseDockerfile: %v", err)
	}
	return tpl
}

func TestParseDockerfileCommonSubset(t *testing.T) {
	df := `# syntax=docker/dockerfile:1
ARG PY=3.12
FROM python:${PY}-slim
ARG PY
ARG USERNAME=app
ENV HOME=/home/$USERNAME \
    APP="my app" \
    PATH=/opt/bin:$PATH
# a comment between instructions
ENV OLD  old style value
RUN apt-get update && \
    apt-get install -y curl
RUN ["pip", "install", "it's quoted"]
COPY --chown=${USERNAME}:staff --chmod=0755 requirements.txt ./src/ /app/
ADD /static /srv/static
WORKDIR $HOME/work
USER ${USERNAME}
EXPOSE 8000
LABEL a=b
CMD ["python", "-m", "http.server", "8000"]
`
	got := parse(t, df, ParseOptions{BaseEnv: map[string]string{"PATH": "/usr/bin"}})
	want := &Template{
		Base: Base{Kind: BaseImage, Ref: "python:3.12-slim"},
		Steps: []Step{
			{Kind: StepArg, Env: []EnvVar{{"PY", "3.12"}}, Line: 4},
			{Kind: StepArg, Env: []EnvVar{{"USERNAME", "app"}}, Line: 5},
			{Kind: StepEnv, Env: []EnvVar{{"HOME", "/home/app"}, {"APP", "my app"}, {"PATH", "/opt/bin:/usr/bin"}}, Line: 6},
			{Kind: StepEnv, Env: []EnvVar{{"OLD", "old style value"}}, Line: 10},
			{Kind: StepRun, Command: "apt-get update &&     apt-get install -y curl", Line: 11},
			{Kind: StepRun, Command: `pip install 'it'\''s quoted'`, Line: 13},
			{Kind: StepCopy, Src: "requirements.txt", Dest: "/app/", User: "app:staff", Mode: 0o755, Line: 14},
			{Kind: StepCopy, Src: "src", Dest: "/app/", User: "app:staff", Mode: 0o755, Line: 14},
			{Kind: StepCopy, Src: "static", Dest: "/srv/static", Line: 15},
			{Kind: StepWorkdir, Path: "/home/app/work", Line: 16},
			{Kind: StepUser, User: "app", Line: 17},
		},
		StartCmd: "python -m http.server 8000",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%+v\nwant\n%+v", got, want)
		for i := range min(len(got.Steps), len(want.Steps)) {
			if !reflect.DeepEqual(got.Steps[i], want.Steps[i]) {
				t.Errorf("step %d: got %+v, want %+v", i, got.Steps[i], want.Steps[i])
			}
		}
	}
}

func TestParseDockerfileSubstitution(t *testing.T) {
	tests := []struct {
		name, df string
		args     map[string]string
		want     []EnvVar // the last ENV step's
	}{
		{"default when unset", "FROM a\nENV X=${NOPE:-fallback}", nil, []EnvVar{{"X", "fallback"}}},
		{"replacement", "FROM a\nARG V=1.2.3\nENV X=${V//./-} Y=${V/./_}", nil, []EnvVar{{"X", "1-2-3"}, {"Y", "1_2.3"}}},
		{"alternative when set", "FROM a\nARG S=1\nENV X=${S:+yes}", nil, []EnvVar{{"X", "yes"}}},
		{"build arg beats default", "FROM a\nARG V=def\nENV X=$V", map[string]string{"V": "given"}, []EnvVar{{"X", "given"}}},
		{"undeclared build arg ignored", "FROM a\nENV X=${V:-none}", map[string]string{"V": "given"}, []EnvVar{{"X", "none"}}},
		{"ENV beats ARG", "FROM a\nARG V=arg\nENV V=env\nENV X=$V", nil, []EnvVar{{"X", "env"}}},
		{"same ENV sees the old value", "FROM a\nENV A=hello\nENV A=bye B=$A", nil, []EnvVar{{"A", "bye"}, {"B", "hello"}}},
		{"single quotes keep the dollar", "FROM a\nENV X='$HOME'", nil, []EnvVar{{"X", "$HOME"}}},
		{"escaped dollar", "FROM a\nENV X=\\$HOME", nil, []EnvVar{{"X", "$HOME"}}},
		{"global ARG needs redeclaring", "ARG G=g\nFROM a\nENV X=[$G]", nil, []EnvVar{{"X", "[]"}}},
		{"global ARG redeclared", "ARG G=g\nFROM a\nARG G\nENV X=[$G]", nil, []EnvVar{{"X", "[g]"}}},
		{"escape directive", "# escape=`\nFROM a\nENV X=`$HOME Y=C:\\dir `\n Z=1", nil, []EnvVar{{"X", "$HOME"}, {"Y", `C:\dir`}, {"Z", "1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tpl := parse(t, tt.df, ParseOptions{BuildArgs: tt.args})
			var last *Step
			for i := range tpl.Steps {
				if tpl.Steps[i].Kind == StepEnv {
					last = &tpl.Steps[i]
				}
			}
			if last == nil || !reflect.DeepEqual(last.Env, tt.want) {
				t.Errorf("last ENV = %+v, want %+v", last, tt.want)
			}
		})
	}
}

func TestParseDockerfileRunIsNotSubstituted(t *testing.T) {
	tpl := parse(t, "FROM a\nARG V=x\nRUN echo $V ${V:-y}", ParseOptions{})
	if got := tpl.Steps[1].Command; got != "echo $V ${V:-y}" {
		t.Errorf("RUN = %q: the shell expands RUN, not the parser", got)
	}
}

func TestParseDockerfileStartCommand(t *testing.T) {
	tests := []struct{ df, want string }{
		{"FROM a", ""},
		{"FROM a\nCMD python app.py", "python app.py"},
		{`FROM a` + "\n" + `CMD ["node", "server.js"]`, "node server.js"},
		{`FROM a` + "\n" + `ENTRYPOINT ["/bin/tini", "--"]` + "\n" + `CMD ["node", "a b.js"]`, "/bin/tini -- node 'a b.js'"},
		{`FROM a` + "\n" + `ENTRYPOINT ["/entry"]` + "\n" + `CMD echo hi`, "/entry /bin/sh -c 'echo hi'"},
		{`FROM a` + "\n" + `ENTRYPOINT exec nginx` + "\n" + `CMD ["ignored"]`, "exec nginx"},
		{"FROM a\nCMD first\nCMD second", "second"},
	}
	for _, tt := range tests {
		if got := parse(t, tt.df, ParseOptions{}).StartCmd; got != tt.want {
			t.Errorf("%q: start command %q, want %q", tt.df, got, tt.want)
		}
	}
}

func TestParseDockerfileRefused(t *testing.T) {
	tests := []struct{ name, df, want string }{
		{"multi-stage AS", "FROM golang AS build\nRUN go build", "line 1: FROM: FROM ... AS: multi-stage"},
		{"second FROM", "FROM a\nRUN x\nFROM b", "line 3: FROM: a second FROM"},
		{"COPY --from", "FROM a\nCOPY --from=build /x /y", "line 2: COPY: --from"},
		{"heredoc", "FROM a\nRUN <<EOF\necho hi\nEOF", "line 2: RUN: heredocs"},
		{"ADD URL", "FROM a\nADD https://example.com/x.tgz /x", "line 2: ADD: source \"https://example.com/x.tgz\": only files"},
		{"ADD git", "FROM a\nADD git@github.com:o/r.git /r", "not URLs"},
		{"ADD archive", "FROM a\nADD app.tar.gz /app", "line 2: ADD: ADD \"app.tar.gz\" would unpack"},
		{"HEALTHCHECK", "FROM a\nHEALTHCHECK CMD curl -f localhost", "line 2: HEALTHCHECK: HEALTHCHECK is not supported"},
		{"ONBUILD", "FROM a\nONBUILD RUN x", "line 2: ONBUILD: ONBUILD is not supported"},
		{"VOLUME", "FROM a\nVOLUME /data", "line 2: VOLUME: VOLUME is not supported"},
		{"SHELL", "FROM a\nSHELL [\"bash\", \"-c\"]", "SHELL is not supported"},
		{"unknown", "FROM a\nFROBNICATE x", "line 2: FROBNICATE: unknown instruction"},
		{"RUN --mount", "FROM a\nRUN --mount=type=cache,target=/c make", "line 2: RUN: flag --mount=type=cache,target=/c is not supported"},
		{"before FROM", "RUN x\nFROM a", "line 1: RUN: only ARG may come before FROM"},
		{"no FROM", "ARG A=1", "no FROM"},
		{"scratch", "FROM scratch", "FROM scratch is not supported"},
		{"escaping source", "FROM a\nCOPY ../secret /x", "climbs out"},
		{"many sources, file dest", "FROM a\nCOPY a b /dest", "must be a directory ending in /"},
		{"symbolic chmod", "FROM a\nCOPY --chmod=u+x a /a", "only an octal mode"},
		{"bad substitution", "FROM a\nENV X=${Y:?required}", "line 2: ENV: cannot substitute"},
		{"empty", "# only a comment\n", "cannot be parsed"},
		{"not a string array", "FROM a\nRUN [\"a\", 1]", "cannot be parsed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseDockerfile([]byte(tt.df), ParseOptions{})
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
			if !strings.Contains(msg(err), tt.want) {
				t.Errorf("message %q does not say %q", msg(err), tt.want)
			}
		})
	}
}

func TestParseDockerfileBounds(t *testing.T) {
	lim := Limits{DockerfileBytes: 4096, LineBytes: 200, Steps: 5, EnvVars: 4, EnvValueBytes: 100, EnvBytes: 300, FieldBytes: 100, CommandBytes: 150}
	tests := []struct {
		name, df string
		class    error
		want     string
	}{
		{"size", "FROM a\n" + strings.Repeat("# pad\n", 1000), errdefs.ErrTooLarge, "the Dockerfile is"},
		{"line", "FROM a\nRUN " + strings.Repeat("x", 300), errdefs.ErrInvalid, "line 2 is 304 bytes"},
		{"NUL", "FROM a\nRUN a\x00b", errdefs.ErrInvalid, "line 2 contains NUL"},
		{"steps", "FROM a\n" + strings.Repeat("RUN x\n", 6), errdefs.ErrInvalid, "more than 5 steps"},
		{"copy sources count as steps", "FROM a\nCOPY a b c d e f /x/", errdefs.ErrInvalid, "more than 5 steps"},
		{"env vars", "FROM a\nENV a=1 b=2 c=3\nENV d=4 e=5", errdefs.ErrInvalid, "more than 4 variables"},
		{"env value", "FROM a\nENV A=" + strings.Repeat("v", 101), errdefs.ErrInvalid, "after substitution, the limit is 100"},
		{"env total", "FROM a\nENV A=" + strings.Repeat("v", 99) + "\nENV B=" + strings.Repeat("v", 99) + "\nENV C=" + strings.Repeat("v", 99) + "\nENV D=" + strings.Repeat("v", 99), errdefs.ErrInvalid, "take more than 300 bytes"},
		{"doubling", "FROM a\nENV A=" + strings.Repeat("v", 60) + "\nENV A=$A$A$A$A$A$A$A$A", errdefs.ErrInvalid, "would make more than 100 bytes"},
		{"replacing", "FROM a\nENV A=" + strings.Repeat("v", 50) + "\nENV B=${A//v/xxxxxxxxxxxxxxxxxxxx}", errdefs.ErrInvalid, "would make more than 100 bytes"},
		{"command", "FROM a\nRUN " + strings.Repeat("y", 160), errdefs.ErrInvalid, "the command is 160 bytes"},
		{"continued command", "FROM a\nRUN " + strings.Repeat("y \\\n", 80) + "y", errdefs.ErrInvalid, "the limit is 150"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseDockerfile([]byte(tt.df), ParseOptions{Limits: lim})
			if !errors.Is(err, tt.class) {
				t.Fatalf("error %v, want class %v", err, tt.class)
			}
			if !strings.Contains(msg(err), tt.want) {
				t.Errorf("message %q does not say %q", msg(err), tt.want)
			}
		})
	}
}

func TestParseDockerfileDoublingIsBoundedByDefaults(t *testing.T) {
	// Each ENV doubles A; the parser must stop at the value limit, not
	// after building 2^40 bytes.
	df := "FROM a\nENV A=vvvvvvvvvvvvvvvv\n" + strings.Repeat("ENV A=$A$A\n", 40)
	_, err := ParseDockerfile([]byte(df), ParseOptions{})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("error %v, want ErrInvalid", err)
	}
}

// msg is what the caller is shown.
func msg(err error) string { return errdefs.Message(err, "(no user message)") }

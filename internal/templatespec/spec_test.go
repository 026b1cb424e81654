package templatespec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

func TestCredentialsNeverShow(t *testing.T) {
	tpl := &Template{Base: Base{Kind: BaseImage, Ref: "registry.example/o/i", Auth: &RegistryAuth{
		Kind: AuthAWS, AWSAccessKeyID: "AKIAKEYID", AWSSecretAccessKey: "TOPSECRET", AWSRegion: "eu-west-1",
	}}}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("build", "template", tpl, "auth", tpl.Base.Auth, "authValue", *tpl.Base.Auth)
	stored, err := json.Marshal(tpl)
	if err != nil {
		t.Fatal(err)
	}
	authJSON, err := json.Marshal(tpl.Base.Auth)
	if err != nil {
		t.Fatal(err)
	}
	outs := map[string]string{
		"%v": fmt.Sprintf("%v", tpl), "%+v": fmt.Sprintf("%+v", tpl), "%#v": fmt.Sprintf("%#v", tpl),
		"%v auth": fmt.Sprintf("%v", tpl.Base.Auth), "%#v auth": fmt.Sprintf("%#v", *tpl.Base.Auth),
		"slog": logged.String(), "template JSON": string(stored), "auth JSON": string(authJSON),
	}
	for how, out := range outs {
		if strings.Contains(out, "TOPSECRET") || strings.Contains(out, "AKIAKEYID") {
			t.Errorf("%s shows a credential: %s", how, out)
		}
	}
	if strings.Contains(string(stored), "auth") {
		t.Errorf("the stored definition carries the credentials at all: %s", stored)
	}
}

func TestValidate(t *testing.T) {
	ok := Template{Base: Base{Kind: BaseBuiltin, Ref: "full"}, Steps: []Step{{Kind: StepRun, Command: "true"}}}
	if err := ok.Validate(Limits{}); err != nil {
		t.Fatalf("valid template: %v", err)
	}
	tests := []struct {
		name string
		t    Template
		want string
	}{
		{"no base", Template{}, "has no base"},
		{"bad kind", Template{Base: Base{Kind: "disk", Ref: "x"}}, `base kind "disk"`},
		{"builtin name", Template{Base: Base{Kind: BaseBuiltin, Ref: "Full"}}, "base builtin: template name"},
		{"no step kind", Template{Base: ok.Base, Steps: []Step{{}}}, "step 1 (): the step has no kind"},
		{"bad step kind", Template{Base: ok.Base, Steps: []Step{{Kind: "HEALTHCHECK"}}}, `step kind "HEALTHCHECK"`},
		{"empty ENV", Template{Base: ok.Base, Steps: []Step{{Kind: StepEnv}}}, "ENV sets no variable"},
		{"control in path", Template{Base: ok.Base, Steps: []Step{{Kind: StepWorkdir, Path: "/a\nb"}}}, "control character"},
		{"ready NUL", Template{Base: ok.Base, ReadyCmd: "\x00"}, "ready command contains NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.t.Validate(Limits{})
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(msg(err), tt.want) {
				t.Errorf("Validate = %v; want ErrInvalid saying %q", err, tt.want)
			}
		})
	}
}

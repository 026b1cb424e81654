package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// refusal is "refused FIELDS: MESSAGE" for a 400 naming its field, the
// error's text for any other error, "" for none.
func refusal(err error) string {
	var e *edge.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e) && e.Status == 400:
		return fmt.Sprintf("refused %v: %s", e.Fields, e.Msg)
	}
	return err.Error()
}

// TestParseCreateSandboxVolumes: a create's volumes are at most 8
// objects, each with a name and a path and maybe read_only, mapped to the
// manager's mounts; anything else is refused naming the field.
func TestParseCreateSandboxVolumes(t *testing.T) {
	o, err := DecodeObject([]byte(`{"volumes":[{"name":"data","path":"/data"},{"name":"vol_1","path":"/ref","read_only":true},{"name":"x","path":"/x","read_only":null}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req, err := ParseCreateSandbox(o)
	if err != nil {
		t.Fatal(err)
	}
	want := []volumes.Mount{{Name: "data", Path: "/data"}, {Name: "vol_1", Path: "/ref", ReadOnly: true}, {Name: "x", Path: "/x"}}
	if got := req.Domain().Volumes; !reflect.DeepEqual(got, want) {
		t.Errorf("mounts %+v, want %+v", got, want)
	}
	// The request as a cluster forwards it (JSON) parses the same.
	data, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if o, err = DecodeObject(data); err != nil {
		t.Fatal(err)
	}
	if again, err := ParseCreateSandbox(o); err != nil || !reflect.DeepEqual(again.Volumes, req.Volumes) {
		t.Errorf("forwarded %s: %+v %v", data, again.Volumes, err)
	}
	if req, err := ParseCreateSandbox(Args{object{}}); err != nil || req.Domain().Volumes != nil {
		t.Errorf("no volumes: %+v %v", req.Domain().Volumes, err)
	}

	nine := strings.Repeat(`{"name":"a","path":"/a"},`, 8) + `{"name":"a","path":"/a"}`
	for body, want := range map[string]string{
		`{"volumes":"data:/data"}`:                                 "refused [volumes]: Expected array, received string",
		`{"volumes":["data"]}`:                                     "refused [volumes 0]: Expected object, received string",
		`{"volumes":[` + nine + `]}`:                               "refused [volumes]: At most 8 volumes can be mounted in a sandbox",
		`{"volumes":[{"path":"/a"}]}`:                              "refused [volumes 0 name]: Each volume must have a name",
		`{"volumes":[{"name":"","path":"/a"}]}`:                    "refused [volumes 0 name]: Each volume must have a name",
		`{"volumes":[{"name":"a","path":"/a"},{"name":"b"}]}`:      "refused [volumes 1 path]: Each volume must have a path",
		`{"volumes":[{"name":1,"path":"/a"}]}`:                     "refused [volumes 0 name]: Expected string, received number",
		`{"volumes":[{"name":"a","path":"/a","read_only":"yes"}]}`: "refused [volumes 0 read_only]: Expected boolean, received string",
		`{"volumes":[{"name":"a","path":"/a","readonly":true}]}`:   "refused [volumes 0 readonly]: volumes[0].readonly: unknown field; a volume takes name, path and read_only",
	} {
		o, err := DecodeObject([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		_, err = ParseCreateSandbox(o)
		if got := refusal(err); got != want {
			t.Errorf("%s: %q, want %q", body, got, want)
		}
	}
}

// TestParseVolumeBodies: the bodies of the volume routes, each field
// checked by name; sizes are MiB, sent on in bytes.
func TestParseVolumeBodies(t *testing.T) {
	const acct = "6F1C0E2A-8B7D-4C1E-9A3F-2D5B6C7E8F90"
	parse := func(body string, f func(Args) (any, error)) (any, error) {
		o, err := DecodeObject([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return f(o)
	}
	create := func(a Args) (any, error) { return ParseCreateVolume(a) }
	resize := func(a Args) (any, error) { return ParseResizeVolume(a) }
	fork := func(a Args) (any, error) { return ParseForkVolume(a) }

	v, err := parse(`{"name":"data","size_mb":2048,"account_id":"`+acct+`"}`, create)
	if c := v.(CreateVolumeRequest); err != nil || c.Name != "data" || c.SizeBytes() != 2*volumes.GiB || c.AccountID != strings.ToLower(acct) || c.ActingFor() != c.AccountID {
		t.Errorf("create: %+v %v", v, err)
	}
	if v, err := parse(`{"name":"data"}`, create); err != nil || v.(CreateVolumeRequest).SizeBytes() != 0 {
		t.Errorf("create without a size (the service's default): %+v %v", v, err)
	}
	if v, err := parse(`{"size_mb":64}`, resize); err != nil || v.(ResizeVolumeRequest).SizeBytes() != volumes.MinSize {
		t.Errorf("resize: %+v %v", v, err)
	}
	if v, err := parse(`{"name":"copy"}`, fork); err != nil || v.(ForkVolumeRequest).Name != "copy" {
		t.Errorf("fork: %+v %v", v, err)
	}

	for _, c := range []struct {
		body  string
		parse func(Args) (any, error)
		want  string
	}{
		{`{}`, create, "refused [name]: name is required"},
		{`{"name":""}`, create, "refused [name]: name is required"},
		{`{"name":7}`, create, "refused [name]: Expected string, received number"},
		{`{"name":"a","size_mb":63}`, create, "refused [size_mb]: size_mb must be a whole number of MiB, at least 64"},
		{`{"name":"a","size_mb":0}`, create, "refused [size_mb]: size_mb must be a whole number of MiB, at least 64"},
		{`{"name":"a","size_mb":64.5}`, create, "refused [size_mb]: Expected integer, received float"},
		{`{"name":"a","size_mb":"1G"}`, create, "refused [size_mb]: Expected number, received string"},
		{`{"name":"a","size_mb":9007199254740992}`, create, "refused [size_mb]: size_mb must be a whole number of MiB, at least 64"},
		{`{"name":"a","account_id":"alice"}`, create, "refused [account_id]: account_id must be a valid UUID"},
		{`{}`, resize, "refused [size_mb]: size_mb is required"},
		{`{"size_mb":-1}`, resize, "refused [size_mb]: size_mb must be a whole number of MiB, at least 64"},
		{`{}`, fork, "refused [name]: name is required"},
	} {
		_, err := parse(c.body, c.parse)
		if got := refusal(err); got != c.want {
			t.Errorf("%s: %q, want %q", c.body, got, c.want)
		}
	}
}

// TestVolumeView: a volume as the API shows it, its attachments an array
// even when there are none.
func TestVolumeView(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	info := volumes.Info{
		Volume: store.Volume{ID: "vol_2", AccountID: "acct", Name: "copy", SizeBytes: 3 * volumes.GiB, GuestWritten: true, DataNode: "node-a",
			BlobKey: "volumes/vol_2/1", Generation: 1, ForkedFrom: "vol_1", CreatedAt: at, UpdatedAt: at.Add(time.Second)},
		Attachments: []store.VolumeAttachment{{SandboxID: "sbx_1", VolumeID: "vol_2", Position: 0, Path: "/data", ReadOnly: true, CreatedAt: at}},
	}
	data, err := json.Marshal(VolumeView(info))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"vol_2","name":"copy","size_mb":3072,"attachments":[{"sandbox_id":"sbx_1","path":"/data","read_only":true}],` +
		`"forked_from":"vol_1","microvm_written":true,"created_at":"2026-01-02T03:04:05.000Z","updated_at":"2026-01-02T03:04:06.000Z"}`
	if string(data) != want {
		t.Errorf("view\n %s\nwant\n %s", data, want)
	}
	data, _ = json.Marshal(VolumeView(volumes.Info{Volume: store.Volume{ID: "vol_1", Name: "data", SizeBytes: volumes.GiB}}))
	if !strings.Contains(string(data), `"attachments":[]`) || !strings.Contains(string(data), `"forked_from":""`) {
		t.Errorf("a volume without attachments: %s", data)
	}
}

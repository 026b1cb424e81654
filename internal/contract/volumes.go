package contract

import (
	"encoding/json"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/volumes"
)

// Volumes (sandboxd): an account's named persistent volumes (ext4 disk
// images, internal/volumes) that outlive every sandbox and are mounted
// into sandboxes at create (CreateSandboxRequest.Volumes).

// MaxCreateVolumes bounds the volumes one create mounts.
const MaxCreateVolumes = 8

// maxVolumeMB is the largest size_mb whose bytes fit an int64; the
// volumes service holds sizes to the server's far smaller bound.
const maxVolumeMB = (1<<63 - 1) / volumes.MiB

// VolumeMount is one volume a create mounts (sandboxd).
type VolumeMount struct {
	Name     string `json:"name" jsonschema:"minLength=1,description=The volume's name or id (vol_...); 404 when the account has none"`
	Path     string `json:"path" jsonschema:"minLength=2,description=Where in the sandbox: an absolute clean path whose names hold letters or digits or ._@+=- or a comma; not / nor /proc or /sys or /dev or /run or /workspace or below them (400)"`
	ReadOnly bool   `json:"read_only,omitempty" jsonschema:"description=Mount it read-only: any number of sandboxes may; a read-write mount is the volume's only one"`
}

// parseVolumeMounts validates a create's volumes: at most
// MaxCreateVolumes objects, each with a name and a path (the manager
// checks the path and resolves the name).
func parseVolumeMounts(o object) ([]VolumeMount, error) {
	items, ok, err := o.objects("volumes")
	if err != nil || !ok {
		return nil, err
	}
	if len(items) > MaxCreateVolumes {
		return nil, FieldError(fmt.Sprintf("At most %d volumes can be mounted in a sandbox", MaxCreateVolumes), "volumes")
	}
	out := make([]VolumeMount, 0, len(items))
	for i, it := range items {
		// A misspelt read_only must not mount a volume read-write.
		for key := range it {
			if key != "name" && key != "path" && key != "read_only" {
				return nil, FieldError(fmt.Sprintf("volumes[%d].%s: unknown field; a volume takes name, path and read_only", i, clipField(key)), "volumes", i, key)
			}
		}
		var m VolumeMount
		name, ok, err := it.str("name", "volumes", i)
		if err != nil {
			return nil, err
		}
		if !ok || name == "" {
			return nil, FieldError("Each volume must have a name", "volumes", i, "name")
		}
		path, ok, err := it.str("path", "volumes", i)
		if err != nil {
			return nil, err
		}
		if !ok || path == "" {
			return nil, FieldError("Each volume must have a path", "volumes", i, "path")
		}
		if it.present("read_only") {
			if err := json.Unmarshal(it["read_only"], &m.ReadOnly); err != nil {
				return nil, typeError("boolean", it["read_only"], []any{"volumes", i, "read_only"})
			}
		}
		m.Name, m.Path = name, path
		out = append(out, m)
	}
	return out, nil
}

// CreateVolumeRequest is the body of POST /api/volumes.
type CreateVolumeRequest struct {
	Name      string `json:"name" jsonschema:"minLength=1,maxLength=63,description=1 to 63 letters or digits or '.' or '_' or '-' starting with a letter or digit (not with vol_); 409 when the account has a volume of that name"`
	SizeMB    int64  `json:"size_mb,omitempty" jsonschema:"minimum=64,description=Size in MiB (default 1024); at most the server's bound for one volume; 429 when the account's volumes would pass its quota"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ActingFor implements ActsFor.
func (r CreateVolumeRequest) ActingFor() string { return r.AccountID }

// SizeBytes is the size asked for in bytes; 0 is the default.
func (r CreateVolumeRequest) SizeBytes() int64 { return r.SizeMB * volumes.MiB }

// ParseCreateVolume validates the body of POST /api/volumes; the volumes
// service checks the name and the size against the server's bounds.
func ParseCreateVolume(a Args) (CreateVolumeRequest, error) {
	o := a.o
	var req CreateVolumeRequest
	name, ok, err := o.str("name")
	if err != nil {
		return req, err
	}
	if !ok || name == "" {
		return req, FieldError("name is required", "name")
	}
	req.Name = name
	if req.SizeMB, _, err = o.sizeMB(false); err != nil {
		return req, err
	}
	req.AccountID, err = o.accountID()
	return req, err
}

// ResizeVolumeRequest is the body of PATCH /api/volumes/{name}.
type ResizeVolumeRequest struct {
	SizeMB    int64  `json:"size_mb" jsonschema:"minimum=64,description=The new size in MiB: no less than the volume's (a volume only grows); its file system grows at its next attach. 409 while it is attached"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ActingFor implements ActsFor.
func (r ResizeVolumeRequest) ActingFor() string { return r.AccountID }

// SizeBytes is the size asked for in bytes.
func (r ResizeVolumeRequest) SizeBytes() int64 { return r.SizeMB * volumes.MiB }

// ParseResizeVolume validates the body of PATCH /api/volumes/{name}.
func ParseResizeVolume(a Args) (ResizeVolumeRequest, error) {
	o := a.o
	var req ResizeVolumeRequest
	var err error
	if req.SizeMB, _, err = o.sizeMB(true); err != nil {
		return req, err
	}
	req.AccountID, err = o.accountID()
	return req, err
}

// ForkVolumeRequest is the body of POST /api/volumes/{name}/fork.
type ForkVolumeRequest struct {
	Name      string `json:"name" jsonschema:"minLength=1,maxLength=63,description=The new volume's name (as a create's); 409 when the account has a volume of that name"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ActingFor implements ActsFor.
func (r ForkVolumeRequest) ActingFor() string { return r.AccountID }

// ParseForkVolume validates the body of POST /api/volumes/{name}/fork.
func ParseForkVolume(a Args) (ForkVolumeRequest, error) {
	o := a.o
	var req ForkVolumeRequest
	name, ok, err := o.str("name")
	if err != nil {
		return req, err
	}
	if !ok || name == "" {
		return req, FieldError("name is required", "name")
	}
	req.Name = name
	req.AccountID, err = o.accountID()
	return req, err
}

// sizeMB returns the size_mb field: a whole number of MiB, at least the
// volumes' least size; required says whether it must be present.
func (o object) sizeMB(required bool) (int64, bool, error) {
	n, ok, err := o.int("size_mb")
	switch {
	case err != nil:
		return 0, false, err
	case !ok && !required:
		return 0, false, nil
	case !ok:
		return 0, false, FieldError("size_mb is required", "size_mb")
	case n < volumes.MinSize/volumes.MiB || n > maxVolumeMB:
		return 0, false, FieldError(fmt.Sprintf("size_mb must be a whole number of MiB, at least %d", volumes.MinSize/volumes.MiB), "size_mb")
	}
	return n, true, nil
}

// Volume is a volume as the API shows it (sandboxd).
type Volume struct {
	ID     string `json:"id" jsonschema:"description=The volume's id (vol_...)"`
	Name   string `json:"name"`
	SizeMB int64  `json:"size_mb" jsonschema:"description=Its size in MiB (a resize applies at its next attach)"`
	// Attachments are the sandboxes it is mounted in now.
	Attachments []VolumeAttachment `json:"attachments" jsonschema:"description=The sandboxes it is mounted in now: one read-write or any number read-only"`
	ForkedFrom  string             `json:"forked_from" jsonschema:"description=The id of the volume it was forked from; empty when it was not"`
	// MicroVMWritten: a microVM had it read-write, so no gVisor sandbox
	// may mount it (its host kernel never mounts a guest-written disk).
	MicroVMWritten bool   `json:"microvm_written" jsonschema:"description=A microVM has had it read-write: a gVisor sandbox may no longer mount it (409)"`
	CreatedAt      string `json:"created_at" jsonschema:"format=date-time"`
	UpdatedAt      string `json:"updated_at" jsonschema:"format=date-time"`
}

// VolumeAttachment is a sandbox's mount of a volume.
type VolumeAttachment struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
	ReadOnly  bool   `json:"read_only"`
}

// VolumeView renders volume v with its attachments.
func VolumeView(v volumes.Info) Volume {
	out := Volume{
		ID: v.ID, Name: v.Name, SizeMB: v.SizeBytes / volumes.MiB, ForkedFrom: v.ForkedFrom, MicroVMWritten: v.GuestWritten,
		Attachments: make([]VolumeAttachment, 0, len(v.Attachments)),
		CreatedAt:   FormatTime(v.CreatedAt), UpdatedAt: FormatTime(v.UpdatedAt),
	}
	for _, a := range v.Attachments {
		out.Attachments = append(out.Attachments, VolumeAttachment{SandboxID: a.SandboxID, Path: a.Path, ReadOnly: a.ReadOnly})
	}
	return out
}

// VolumeResponse answers the routes of one volume.
type VolumeResponse struct {
	Status string `json:"status" jsonschema:"enum=success"`
	Volume Volume `json:"volume"`
}

// VolumesResponse answers GET /api/volumes.
type VolumesResponse struct {
	Status  string   `json:"status" jsonschema:"enum=success"`
	Volumes []Volume `json:"volumes"`
}

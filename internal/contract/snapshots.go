package contract

import (
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// Named snapshots (sandboxd): a sandbox's files saved under a name of its
// account, stored as a template of kind snapshot (templates.Snapshot).

// CreateSnapshotRequest is the body of POST /api/sandboxes/{id}/snapshots.
type CreateSnapshotRequest struct {
	Name      string `json:"name,omitempty" jsonschema:"minLength=1,maxLength=192,description=name[:tag] of the snapshot (tag latest by default); a snapshot of that name and tag is replaced (the name moves to the new one); absent: the snapshot is named by its id. 409 when a template has that name and tag"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ActingFor implements ActsFor.
func (r CreateSnapshotRequest) ActingFor() string { return r.AccountID }

// ParseCreateSnapshot validates the body of POST
// /api/sandboxes/{id}/snapshots; the templates service checks the name.
func ParseCreateSnapshot(a Args) (CreateSnapshotRequest, error) {
	o := a.o
	var req CreateSnapshotRequest
	name, ok, err := o.str("name")
	if err != nil {
		return req, err
	}
	if ok && name == "" {
		return req, FieldError("name cannot be empty (leave it out to name the snapshot by its id)", "name")
	}
	req.Name = name
	req.AccountID, err = o.accountID()
	return req, err
}

// NamedSnapshot is one named snapshot of an account.
type NamedSnapshot struct {
	ID   string `json:"id" jsonschema:"description=The snapshot's id (a template id: tpl_...)"`
	Name string `json:"name"`
	Tag  string `json:"tag"`
	// Ref is name:tag, what a create's snapshot (or template) names.
	Ref string `json:"ref" jsonschema:"description=name:tag: what POST /api/sandboxes' snapshot names"`
	// SandboxID is the sandbox it was taken of.
	SandboxID string `json:"sandbox_id"`
	CreatedAt string `json:"created_at" jsonschema:"format=date-time"`
}

// NamedSnapshotView renders named snapshot t.
func NamedSnapshotView(t store.Template) NamedSnapshot {
	return NamedSnapshot{ID: t.ID, Name: t.Name, Tag: t.Tag, Ref: t.Name + ":" + t.Tag, SandboxID: templates.SavedFrom(t), CreatedAt: FormatTime(t.CreatedAt)}
}

// NamedSnapshotResponse answers the routes of one named snapshot.
type NamedSnapshotResponse struct {
	Status   string        `json:"status" jsonschema:"enum=success"`
	Snapshot NamedSnapshot `json:"snapshot"`
}

// PromoteSnapshotRequest is the body of POST /api/snapshots/{name}/template.
type PromoteSnapshotRequest struct {
	Name      string `json:"name" jsonschema:"minLength=1,maxLength=192,description=name[:tag] of the new template (tag latest by default); 409 when the account has a template or snapshot of that name and tag"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ActingFor implements ActsFor.
func (r PromoteSnapshotRequest) ActingFor() string { return r.AccountID }

// ParsePromoteSnapshot validates the body of POST
// /api/snapshots/{name}/template.
func ParsePromoteSnapshot(a Args) (PromoteSnapshotRequest, error) {
	s, err := ParseSaveTemplate(a)
	return PromoteSnapshotRequest(s), err
}

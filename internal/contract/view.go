package contract

import (
	"encoding/json"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/store"
)

// FormatTime writes a time as the contract does: UTC, milliseconds, Z.
func FormatTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// FormatTimePtr is FormatTime of a time that may be unset (null).
func FormatTimePtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := FormatTime(*t)
	return &s
}

// ViewRun renders a run in trigger.dev's v3 shape (GET /api/tasks/runs),
// as of now.
func ViewRun(run store.Run, now time.Time) Run {
	v := Run{
		ID:             run.ID,
		TaskIdentifier: run.Task,
		Status:         string(run.Status),
		CreatedAt:      FormatTime(run.CreatedAt),
		UpdatedAt:      FormatTime(run.UpdatedAt),
		StartedAt:      FormatTimePtr(run.StartedAt),
		FinishedAt:     FormatTimePtr(run.FinishedAt),
		SandboxID:      run.SandboxID,
		Tags:           run.Tags,
		Payload:        run.Payload,
		Output:         run.Output,
	}
	switch run.Status {
	case store.RunCompleted:
		v.IsCompleted, v.IsSuccess = true, true
	case store.RunFailed, store.RunCrashed:
		v.IsCompleted, v.IsFailed = true, true
	case store.RunCanceled:
		v.IsCompleted = true
	}
	if v.Tags == nil {
		v.Tags = []string{}
	}
	if len(v.Payload) == 0 {
		v.Payload = json.RawMessage("{}")
	}
	if len(v.Output) == 0 {
		v.Output = json.RawMessage("null")
	}
	if len(run.Error) > 0 && string(run.Error) != "null" {
		var e RunError
		if json.Unmarshal(run.Error, &e) == nil {
			v.Error = &e
		}
	}
	// A number on every run, as the published schema types it: 0 until the
	// run starts, the time so far while it runs.
	switch {
	case run.StartedAt != nil && run.FinishedAt != nil:
		v.DurationMs = max(0, run.FinishedAt.Sub(*run.StartedAt).Milliseconds())
	case run.StartedAt != nil:
		v.DurationMs = max(0, now.Sub(*run.StartedAt).Milliseconds())
	}
	return v
}

// binaryExtensions are the file types the original API always sent base64.
var binaryExtensions = map[string]bool{
	".png": true, ".jpg": true, ".jpeg": true, ".gif": true, ".webp": true, ".svg": true, ".ico": true,
	".bmp": true, ".tiff": true, ".pdf": true, ".woff": true, ".woff2": true, ".ttf": true, ".otf": true,
	".eot": true, ".zip": true, ".tar": true, ".gz": true, ".bz2": true, ".mp3": true, ".mp4": true,
	".wav": true, ".ogg": true, ".webm": true, ".avif": true,
}

// IsBinary decides whether GET /api/sandboxes/file sends a file base64: by
// extension, or by content (NUL bytes or invalid UTF-8) so that no byte is
// lost in a JSON string.
func IsBinary(name string, data []byte) bool {
	if binaryExtensions[strings.ToLower(path.Ext(name))] {
		return true
	}
	for _, b := range data {
		if b == 0 {
			return true
		}
	}
	return !utf8.Valid(data)
}

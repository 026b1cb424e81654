package templates

import (
	"context"

	"github.com/sandboxd/sandboxd/internal/filecopy"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// SetFilesOf replaces how a COPY reaches a build sandbox's files (the
// fake runtime has no agent).
func SetFilesOf(s *Service, f func(context.Context, runtime.Sandbox) (filecopy.FS, error)) {
	s.filesOf = f
}

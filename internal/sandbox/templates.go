package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// Templates finds the templates sandboxes start from; package templates'
// Catalog is one.
type Templates interface {
	// Find resolves "name[:tag]" among the account's templates, then the
	// public ones; it must be ready (errdefs classes otherwise).
	Find(ctx context.Context, accountID, name string) (templates.Image, error)
	// ByID is the image of a template a sandbox started from.
	ByID(ctx context.Context, id string) (templates.Image, error)
}

// template resolves a create's template, or its named snapshot (a
// template of kind snapshot; only one of the two is given), to its id (""
// for none), refusing what this server cannot start.
func (m *Manager) template(ctx context.Context, accountID, name, snapshot string) (string, error) {
	what := "custom templates"
	if snapshot != "" {
		if name != "" {
			return "", errdefs.New(errdefs.ErrInvalid, "give a template or a snapshot, not both")
		}
		name, what = snapshot, "named snapshots"
	}
	if name == "" {
		return "", nil
	}
	if !m.rt.Capabilities().AnyRootFS {
		return "", errdefs.Newf(errdefs.ErrInvalid, "this server's runtime cannot start %s", what)
	}
	if m.cfg.Templates == nil {
		return "", errdefs.Newf(errdefs.ErrInvalid, "%s are not enabled on this server", what)
	}
	img, err := m.cfg.Templates.Find(ctx, accountID, name)
	if snapshot != "" && (errors.Is(err, errdefs.ErrNotFound) || (err == nil && !img.Snapshot)) {
		return "", errdefs.Newf(errdefs.ErrNotFound, "snapshot %s not found", snapshot)
	}
	if err != nil {
		return "", err
	}
	return img.TemplateID, nil
}

// fromTemplate makes spec start from sb's template, when it has one: its
// root filesystem, with the image's Env added and its WORKDIR and USER the
// defaults of the sandbox's commands. The account's snapshot is never
// restored on it (persist's layers hook leaves it out); only its
// template's pool serves it (spec.Template: runtime.PoolKey, tplpool.go).
//
// A template built with steps adds its layer chain (spec.Layers, free: a
// template's sandbox never restores the account's snapshot); release
// closes the layers once the runtime took them.
func (m *Manager) fromTemplate(ctx context.Context, sb store.Sandbox, spec *runtime.Spec) (img templates.Image, release func(), err error) {
	noop := func() {}
	if sb.TemplateID == "" {
		return img, noop, nil
	}
	if m.cfg.Templates == nil {
		return img, noop, errdefs.New(errdefs.ErrInvalid, "templates are not enabled on this server")
	}
	img, err = m.cfg.Templates.ByID(ctx, sb.TemplateID)
	if err != nil {
		return img, noop, err
	}
	spec.BaseDir, spec.BaseImage, spec.Template = img.RootFS, img.BaseImage, img.TemplateID
	spec.Env = append(spec.Env, img.Config.Env...)
	if len(img.Layers) == 0 {
		return img, noop, nil
	}
	layers, release, err := img.OpenLayers(ctx)
	if err != nil {
		return img, noop, err
	}
	spec.Layers = layers
	return img, release, nil
}

// templateReadyTimeout bounds a template's start and ready commands at a
// sandbox's start.
const templateReadyTimeout = 2 * time.Minute

// startTemplate runs img's start command in a sandbox from it and waits
// for its ready command (templates.StartCommand), as the template's user
// in its WORKDIR; the reason is the sandbox's failure reason.
func (m *Manager) startTemplate(ctx context.Context, rsb runtime.Sandbox, img templates.Image) (reason string, err error) {
	if img.StartCmd == "" && img.ReadyCmd == "" {
		return "", nil
	}
	err = templates.StartCommand(ctx, rsb, img.StartCmd, img.ReadyCmd, img.Config.WorkingDir, userName(img.Config.User), templateReadyTimeout, nil)
	if err != nil {
		return "its template's " + errdefs.Message(err, "start command failed"), err
	}
	return "", nil
}

// StartBuildSandbox implements templates.BuildHost: a sandbox with no row,
// of the runtime's default limits, on req's base and layers, with a
// network of req's policy when this server gives sandboxes networks (else
// loopback only). stop destroys it and its network.
func (m *Manager) StartBuildSandbox(ctx context.Context, req templates.BuildSandbox) (runtime.Sandbox, func(context.Context), error) {
	if !m.rt.Capabilities().AnyRootFS {
		return nil, nil, errdefs.New(errdefs.ErrInvalid, "this server's runtime cannot start custom templates")
	}
	// The disk must hold one more sandbox now; a build sandbox has no
	// row, so later admissions do not count it (builds take turns, see
	// package templates).
	release, err := m.admitDisk(ctx, 1)
	if err != nil {
		return nil, nil, err
	}
	release()
	limits := m.cfg.Settings.Limits
	// The build's own size (E2B's cpuCount and memoryMB), which package
	// templates bounded.
	if req.CPUs > 0 {
		limits.CPUs = req.CPUs
	}
	if req.MemoryBytes > 0 {
		limits.MemoryBytes = req.MemoryBytes
	}
	spec := runtime.Spec{ID: req.ID, BaseDir: req.BaseDir, BaseImage: req.BaseImage, Layers: req.Layers, Env: req.Env,
		Limits: limits, Hostname: "build"}
	stopNet := func(context.Context) {}
	if hasNetwork(req.Network) && m.network != nil && m.rt.Capabilities().Network {
		pre, ok1 := m.network.(PrestartHook)
		stop, ok2 := m.network.(StopHook)
		if ok1 && ok2 {
			policy, err := json.Marshal(req.Network)
			if err != nil {
				return nil, nil, err
			}
			stopNet = func(ctx context.Context) {
				if err := stop.Stop(ctx, req.ID); err != nil {
					m.log.Warn("tear down a build sandbox's network", "id", req.ID, "err", err)
				}
			}
			if err := pre.Prestart(ctx, store.Sandbox{ID: req.ID, Network: string(policy)}, &spec); err != nil {
				stopNet(context.WithoutCancel(ctx))
				return nil, nil, errdefs.Wrap(nil, err, "the build sandbox's network could not be set up")
			}
		}
	}
	rsb, err := m.rt.Create(ctx, spec)
	if err != nil {
		stopNet(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return rsb, func(ctx context.Context) {
		if err := rsb.Destroy(ctx); err != nil {
			m.log.Warn("destroy a build sandbox", "id", req.ID, "err", err)
		}
		stopNet(ctx)
	}, nil
}

var _ templates.BuildHost = (*Manager)(nil)

// ExecDefaults are the working directory and the user of the commands a
// user runs in sb (exec, runs) when the request names none: its
// template's WORKDIR and USER, or "" (the agent's: /workspace, root). The
// service's own commands in a sandbox (workspace, setup, save) do not ask
// and run as root.
func (m *Manager) ExecDefaults(ctx context.Context, sb store.Sandbox) (cwd, user string, err error) {
	d, err := m.templateExec(ctx, sb)
	return d.cwd, d.user, err
}

// TemplateEnv is the environment sb's template gives its processes (the
// image's and the steps' ENV; none for the built-in image): the runtime
// adds it to every exec, and E2B's envd plane, which talks to the agent
// itself, adds it to the processes it starts.
func (m *Manager) TemplateEnv(ctx context.Context, sb store.Sandbox) ([]string, error) {
	d, err := m.templateExec(ctx, sb)
	return d.env, err
}

// StandsOnBuiltin says sb's template is the server's built-in image with
// files over it and no image config of its own: a named snapshot of a
// sandbox of the built-in image, or the files a pause of a sandbox's files
// alone saved (pausefiles.go). Its commands' defaults are the built-in
// image's (E2B's DefaultUser), not a template's root.
func (m *Manager) StandsOnBuiltin(ctx context.Context, sb store.Sandbox) bool {
	d, err := m.templateExec(ctx, sb)
	return err == nil && d.builtin
}

// execDefaults are a template's directory, user and environment of the
// commands a user runs, and whether it stands on the built-in image
// (StandsOnBuiltin).
type execDefaults struct {
	cwd, user string
	env       []string
	builtin   bool
}

func (m *Manager) templateExec(ctx context.Context, sb store.Sandbox) (execDefaults, error) {
	if sb.TemplateID == "" || m.cfg.Templates == nil {
		return execDefaults{}, nil
	}
	if d, ok := m.execDefaults.Load(sb.TemplateID); ok {
		return d.(execDefaults), nil
	}
	img, err := m.cfg.Templates.ByID(ctx, sb.TemplateID)
	if err != nil {
		return execDefaults{}, err
	}
	// A ready template's config never changes: keep it.
	d := execDefaults{cwd: img.Config.WorkingDir, user: userName(img.Config.User), env: img.Config.Env,
		builtin: img.BaseImage != "" && img.BaseImage == m.cfg.BaseID && img.Config.User == "" && img.Config.WorkingDir == ""}
	m.execDefaults.Store(sb.TemplateID, d)
	return d, nil
}

// userName is the user part of an image's USER ("name", "name:group"):
// the agent runs commands as a user its /etc/passwd names. A numeric uid
// is passed as it is, and refused by the agent unless a user has that
// name.
func userName(user string) string {
	name, _, _ := strings.Cut(user, ":")
	return name
}

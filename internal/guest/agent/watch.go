package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	pb "github.com/sandboxd/sandboxd/internal/guest/pb/filesystem"
)

// Bounds on directory watching: watchers held for polling, the events one
// keeps between polls (older ones are dropped), and the directories one
// recursive watch adds (inotify watches are a kernel resource).
const (
	maxWatchers      = 64
	maxWatcherEvents = 4096
	maxWatchedDirs   = 8192
)

// watch is one fsnotify watcher over a directory, optionally recursive.
type watch struct {
	a         *Agent
	u         *account // the user it watches as; nil: the agent
	w         *fsnotify.Watcher
	root      string
	recursive bool
	entries   bool
	envd      bool // entries as envd gives them (guest.EnvdHeader)
	dirs      int
}

// newWatch watches path. Acting as a user, the directories are added on
// its thread (asUser): inotify_add_watch needs read permission on each,
// so the user hears only of directories it may list. (Events are then
// read, and their entries stat'ed, by the agent.)
func (a *Agent) newWatch(path string, u *account, recursive, entries, envd bool) (*watch, error) {
	root, err := a.abs(path, u)
	if err != nil {
		return nil, err
	}
	var w *watch
	err = asUser(u, func() error {
		fi, err := os.Stat(root)
		if err != nil {
			return fsError(err)
		}
		if !fi.IsDir() {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s is not a directory", root))
		}
		fw, err := fsnotify.NewWatcher()
		if err != nil {
			return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("watch %s: %w", root, err))
		}
		w = &watch{a: a, u: u, w: fw, root: root, recursive: recursive, entries: entries, envd: envd}
		if err := w.add(root); err != nil {
			fw.Close()
			return fsError(err)
		}
		return nil
	})
	if err != nil {
		return nil, fsError(err)
	}
	return w, nil
}

// add watches dir and, when recursive, the directories under it. It runs
// as w's user (see newWatch).
func (w *watch) add(dir string) error {
	if !w.recursive {
		return w.addOne(dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil // vanished or unreadable: watch what can be watched
		}
		if w.dirs >= maxWatchedDirs {
			return filepath.SkipAll
		}
		if err := w.addOne(p); err != nil && p == dir {
			return err
		}
		return nil
	})
}

// addOne watches dir if it may be read. Linux's inotify_add_watch checks
// that itself; gVisor's did not (runsc 20221219 watched a 0700 directory
// of root's for a user), so a user could hear of the entries of a
// directory it may not list: opening it first checks it on both.
func (w *watch) addOne(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	f.Close()
	w.dirs++
	return w.w.Add(dir)
}

// event converts an fsnotify event, following new directories of a
// recursive watch.
func (w *watch) event(ev fsnotify.Event) *pb.FilesystemEvent {
	rel, err := filepath.Rel(w.root, ev.Name)
	if err != nil {
		rel = ev.Name
	}
	out := &pb.FilesystemEvent{Name: rel}
	switch {
	case ev.Has(fsnotify.Create):
		out.Type = pb.EventType_EVENT_TYPE_CREATE
		if w.recursive {
			if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
				_ = asUser(w.u, func() error { return w.add(ev.Name) })
			}
		}
	case ev.Has(fsnotify.Write):
		out.Type = pb.EventType_EVENT_TYPE_WRITE
	case ev.Has(fsnotify.Remove):
		out.Type = pb.EventType_EVENT_TYPE_REMOVE
	case ev.Has(fsnotify.Rename):
		out.Type = pb.EventType_EVENT_TYPE_RENAME
	case ev.Has(fsnotify.Chmod):
		out.Type = pb.EventType_EVENT_TYPE_CHMOD
	default:
		return nil
	}
	if w.entries && out.Type != pb.EventType_EVENT_TYPE_REMOVE && out.Type != pb.EventType_EVENT_TYPE_RENAME {
		// As the user it watches as: what it may see of the entry (its
		// metadata) is what it may see with Stat.
		_ = asUser(w.u, func() error {
			if fi, err := os.Lstat(ev.Name); err == nil {
				out.Entry = w.a.entry(ev.Name, fi, w.envd)
			}
			return nil
		})
	}
	return out
}

func (s filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	u, err := s.a.requestUser(req.Header())
	if err != nil {
		return err
	}
	w, err := s.a.newWatch(req.Msg.GetPath(), u, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), envdAnswers(req.Header()))
	if err != nil {
		return err
	}
	defer w.w.Close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keep := time.NewTicker(keepAliveEvery)
	defer keep.Stop()
	for {
		select {
		case ev, ok := <-w.w.Events:
			if !ok {
				return nil
			}
			if e := w.event(ev); e != nil {
				if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
					return err
				}
			}
		case err, ok := <-w.w.Errors:
			if !ok {
				return nil
			}
			return connect.NewError(connect.CodeInternal, fmt.Errorf("watch %s: %w", w.root, err))
		case <-keep.C:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// watchers are the watches held for polling (CreateWatcher).
type watchers struct {
	mu sync.Mutex
	m  map[string]*polled
}

// polled is a watch whose events wait for GetWatcherEvents.
type polled struct {
	w       *watch
	mu      sync.Mutex
	events  []*pb.FilesystemEvent
	dropped int
	err     error
	done    chan struct{}
}

func newWatchers() *watchers { return &watchers{m: map[string]*polled{}} }

func (p *polled) collect() {
	defer close(p.done)
	for {
		select {
		case ev, ok := <-p.w.w.Events:
			if !ok {
				return
			}
			if e := p.w.event(ev); e != nil {
				p.mu.Lock()
				if len(p.events) >= maxWatcherEvents {
					p.events = p.events[1:]
					p.dropped++
				}
				p.events = append(p.events, e)
				p.mu.Unlock()
			}
		case err, ok := <-p.w.w.Errors:
			if !ok {
				return
			}
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
		}
	}
}

func (s filesystemService) CreateWatcher(_ context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	ws := s.a.watch
	ws.mu.Lock()
	n := len(ws.m)
	ws.mu.Unlock()
	if n >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d watchers already; remove one first", n))
	}
	u, err := s.a.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	w, err := s.a.newWatch(req.Msg.GetPath(), u, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), envdAnswers(req.Header()))
	if err != nil {
		return nil, err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	p := &polled{w: w, done: make(chan struct{})}
	ws.mu.Lock()
	ws.m[id] = p
	ws.mu.Unlock()
	go p.collect()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (s filesystemService) polled(id string) (*polled, error) {
	ws := s.a.watch
	ws.mu.Lock()
	defer ws.mu.Unlock()
	p := ws.m[id]
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such watcher"))
	}
	return p, nil
}

func (s filesystemService) GetWatcherEvents(_ context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	p, err := s.polled(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("watcher failed: %w", p.err))
	}
	evs := p.events
	p.events = nil
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

func (s filesystemService) RemoveWatcher(_ context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	p, err := s.polled(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	ws := s.a.watch
	ws.mu.Lock()
	delete(ws.m, req.Msg.GetWatcherId())
	ws.mu.Unlock()
	p.w.w.Close()
	<-p.done
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}

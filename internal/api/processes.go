package api

import (
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// killSignals are the signals DELETE .../processes/{pid} sends by name.
var killSignals = map[string]syscall.Signal{
	"SIGKILL": syscall.SIGKILL, "SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT,
	"SIGHUP": syscall.SIGHUP, "SIGQUIT": syscall.SIGQUIT,
}

// sandboxOfQuery is the start of the routes on one sandbox whose input
// is the query: the account_id asked for, the sandbox if the caller may
// act on it, and a server that runs sandboxes.
func (s *Server) sandboxOfQuery(r *http.Request) (store.Sandbox, error) {
	requested, err := queryAccountID(r.URL.Query())
	if err != nil {
		return store.Sandbox{}, err
	}
	sb, err := s.sandboxFor(r, requested)
	if err != nil {
		return sb, err
	}
	if s.opts.Sandboxes == nil {
		return sb, errNotAvailable
	}
	return sb, nil
}

func (s *Server) processes(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxOfQuery(r)
	if err != nil {
		return err
	}
	ps, err := s.opts.Sandboxes.Processes(r.Context(), principal(r), sb.ID)
	if err != nil {
		return serviceError(err, "Sandbox not found")
	}
	resp := ProcessesResponse{Status: "success", Processes: make([]Process, 0, len(ps))}
	for _, p := range ps {
		resp.Processes = append(resp.Processes, Process{
			PID: p.PID, Tag: p.Tag, Command: p.Cmd, Cwd: p.Cwd, PTY: p.TTY,
			StartedAt: p.Started.UTC().Format(time.RFC3339Nano),
		})
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) killProcess(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return errBadRequest("pid must be a positive integer")
	}
	sig := syscall.SIGKILL
	if name := q.Get("signal"); name != "" {
		var ok bool
		if sig, ok = killSignals[name]; !ok {
			return errBadRequest("signal must be one of SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT")
		}
	}
	sb, err := s.sandboxOfQuery(r)
	if err != nil {
		return err
	}
	if err := s.opts.Sandboxes.SignalProcess(r.Context(), principal(r), sb.ID, pid, sig); err != nil {
		return serviceError(err, "Process not found")
	}
	writeJSON(w, http.StatusOK, StatusResponse{Status: "success"})
	return nil
}

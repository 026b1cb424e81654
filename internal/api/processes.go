package api

import (
	"net/http"
	"strconv"
	"syscall"
	"time"
)

// killSignals are the signals DELETE .../processes/{pid} sends by name.
var killSignals = map[string]syscall.Signal{
	"SIGKILL": syscall.SIGKILL, "SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT,
	"SIGHUP": syscall.SIGHUP, "SIGQUIT": syscall.SIGQUIT,
}

func (s *Server) processes(w http.ResponseWriter, r *http.Request) error {
	requested, err := queryAccountID(r.URL.Query())
	if err != nil {
		return err
	}
	sb, err := s.sandboxFor(r, requested)
	if err != nil {
		return err
	}
	if s.opts.Sandboxes == nil {
		return errNotAvailable
	}
	ps, err := s.opts.Sandboxes.Processes(r.Context(), sb)
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
	requested, err := queryAccountID(q)
	if err != nil {
		return err
	}
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
	sb, err := s.sandboxFor(r, requested)
	if err != nil {
		return err
	}
	if s.opts.Sandboxes == nil {
		return errNotAvailable
	}
	if err := s.opts.Sandboxes.SignalProcess(r.Context(), sb, pid, sig); err != nil {
		return serviceError(err, "Process not found")
	}
	writeJSON(w, http.StatusOK, StatusResponse{Status: "success"})
	return nil
}

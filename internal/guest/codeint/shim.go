package codeint

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// shimSource is the Python program that drives the kernels (shim.py): the
// agent runs it with python3 -c, so an image needs Jupyter's packages and
// nothing of sandboxd's.
//
//go:embed shim.py
var shimSource string

// maxEventLine bounds one line the shim writes: its values are cut at
// 10 MiB (MAX_VALUE in shim.py), which JSON escaping can at most double,
// and a shim that writes more is not trusted further.
const maxEventLine = 24 << 20

// request is one line to the shim.
type request struct {
	ID     int64             `json:"id"`
	Op     string            `json:"op"`
	Ctx    string            `json:"ctx"`
	Kernel string            `json:"kernel,omitempty"`
	Cwd    string            `json:"cwd,omitempty"`
	Env    map[string]string `json:"env,omitempty"`
	Code   *string           `json:"code,omitempty"`
}

// event is one line from the shim (the fields of its kinds together).
type event struct {
	ID        int64                      `json:"id"`
	Ev        string                     `json:"ev"`
	Language  string                     `json:"language"`
	Message   string                     `json:"message"`
	N         int                        `json:"n"`
	Name      string                     `json:"name"`
	Text      string                     `json:"text"`
	Time      string                     `json:"time"`
	Data      map[string]json.RawMessage `json:"data"`
	Main      bool                       `json:"main"`
	Ename     string                     `json:"ename"`
	Evalue    string                     `json:"evalue"`
	Traceback []string                   `json:"traceback"`
}

// final reports whether e ends the request it answers.
func (e event) final() bool {
	switch e.Ev {
	case "done", "died", "started", "failed", "restarted", "removed":
		return true
	}
	return false
}

// shim is one running shim process (one per user of a sandbox) and the
// requests waiting for its answers.
type shim struct {
	proc *Process

	wmu sync.Mutex // one request line at a time

	mu      sync.Mutex
	next    int64
	waiters map[int64]chan event
	// gone is closed when the process has exited or broke the protocol;
	// err says why.
	gone chan struct{}
	err  error
}

func newShim(p *Process) *shim {
	s := &shim{proc: p, waiters: map[int64]chan event{}, gone: make(chan struct{})}
	go s.read()
	return s
}

// read dispatches the shim's events to their requests until it exits.
func (s *shim) read() {
	br := bufio.NewReaderSize(s.proc.Stdout, 64<<10)
	var err error
	for {
		var line []byte
		line, err = readLine(br, maxEventLine)
		if err != nil {
			break
		}
		var e event
		if err = json.Unmarshal(line, &e); err != nil {
			err = fmt.Errorf("the code interpreter wrote a line that is not an event: %w", err)
			break
		}
		s.mu.Lock()
		ch := s.waiters[e.ID]
		if e.final() {
			delete(s.waiters, e.ID)
		}
		s.mu.Unlock()
		if ch != nil {
			// Blocks while the request's reader is slow: the shim then
			// waits too, which bounds what is held here.
			ch <- e
			if e.final() {
				close(ch)
			}
		}
	}
	if errors.Is(err, io.EOF) {
		err = errors.New("the code interpreter exited")
	}
	s.proc.Kill()
	s.proc.Stdout.Close()
	s.proc.Stdin.Close()
	s.mu.Lock()
	s.err = err
	for id, ch := range s.waiters {
		close(ch)
		delete(s.waiters, id)
	}
	s.mu.Unlock()
	close(s.gone)
}

// readLine reads one line of at most max bytes, without its newline.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var buf bytes.Buffer
	for {
		chunk, err := br.ReadSlice('\n')
		if buf.Len()+len(chunk) > max {
			return nil, fmt.Errorf("the code interpreter wrote a line of more than %d bytes", max)
		}
		buf.Write(chunk)
		switch {
		case err == nil:
			return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// call sends req and returns the channel its events arrive on, closed
// after the final one (or when the shim goes: then without a final one).
// A request that wants no answer (interrupt) passes wait false.
func (s *shim) call(req request, wait bool) (<-chan event, error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	s.next++
	req.ID = s.next
	var ch chan event
	if wait {
		ch = make(chan event, 16)
		s.waiters[req.ID] = ch
	}
	s.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	s.wmu.Lock()
	_, err = s.proc.Stdin.Write(append(b, '\n'))
	s.wmu.Unlock()
	if err != nil {
		s.mu.Lock()
		delete(s.waiters, req.ID)
		s.mu.Unlock()
		return nil, fmt.Errorf("the code interpreter is not taking requests: %w", err)
	}
	return ch, nil
}

// alive reports whether the shim still runs.
func (s *shim) alive() bool {
	select {
	case <-s.gone:
		return false
	default:
		return true
	}
}

// close ends the shim: closing its input makes it stop its kernels and
// exit; Kill makes sure.
func (s *shim) close() {
	s.proc.Stdin.Close()
	s.proc.Kill()
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sandboxd/sandboxd/internal/guest/pb/process"
)

// The output streams of a process, indexes into process.out.
const (
	streamStdout = iota
	streamStderr
	streamPTY
	numStreams
)

// keepAliveEvery is how often a quiet process stream carries a keepalive,
// so a connection that died is noticed by the agent too.
const keepAliveEvery = 30 * time.Second

// DefaultTailBytes is Options.TailBytes's default.
const DefaultTailBytes = 1 << 20

// process is one process the agent started. It runs on whether or not
// anybody follows it; followers (subscribers) come and go.
type process struct {
	pid     int
	tag     string
	cfg     *pb.ProcessConfig
	started time.Time
	pty     *os.File       // the terminal's master; nil without one
	stdin   io.WriteCloser // nil: input is /dev/null
	// ttySig is the way to the process's tty-session helper, which sends
	// its terminal's signals (Options.TTYSignals); nil without one.
	ttySig *ttySignaller

	done chan struct{} // closed once end is set and the output collected

	mu        sync.Mutex
	out       [numStreams]tail
	subs      map[*subscriber]struct{}
	end       *pb.ProcessEvent_EndEvent
	ended     time.Time
	stdinShut bool
	timedOut  bool
	oomKilled bool
}

func (p *process) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *process) endedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended
}

// chunk is output of one stream at an offset.
type chunk struct {
	stream int
	off    uint64
	data   []byte
}

// subscriber is one follower of a process's output.
type subscriber struct {
	ch   chan chunk
	gone chan struct{}
	next [numStreams]uint64 // the follower's own: what it has delivered up to
}

// send hands c to the follower, waiting for it (its connection's flow
// control slows the process down, as a pipe would) unless it went away.
func (s *subscriber) send(c chunk) {
	select {
	case s.ch <- c:
	case <-s.gone:
	}
}

// publish records output and hands it to the followers.
func (p *process) publish(stream int, b []byte) {
	data := append([]byte(nil), b...)
	p.mu.Lock()
	off := p.out[stream].total
	p.out[stream].write(data)
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		s.send(chunk{stream: stream, off: off, data: data})
	}
}

// subscribe starts following p from the offsets in from: it returns the
// follower, what the tails still hold from there (the replay), the offsets
// the replay begins at, and p's end when it has ended already.
func (p *process) subscribe(from [numStreams]uint64) (*subscriber, []chunk, [numStreams]uint64, *pb.ProcessEvent_EndEvent) {
	s := &subscriber{ch: make(chan chunk, 16), gone: make(chan struct{})}
	var replay []chunk
	var offs [numStreams]uint64
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range numStreams {
		data, off := p.out[i].from(from[i])
		// Delivering the replay moves next on; a chunk published before
		// this subscription but handed over after it overlaps the replay
		// and is cut off then.
		offs[i] = off
		s.next[i] = off
		if len(data) > 0 {
			replay = append(replay, chunk{stream: i, off: off, data: data})
		}
	}
	if p.end == nil {
		p.subs[s] = struct{}{}
	}
	return s, replay, offs, p.end
}

func (p *process) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

// dataEvent is one output event; offsets already delivered are cut off.
func (s *subscriber) dataEvent(c chunk) *pb.ProcessEvent {
	if end := c.off + uint64(len(c.data)); end <= s.next[c.stream] {
		return nil
	} else if c.off < s.next[c.stream] {
		c.data = c.data[s.next[c.stream]-c.off:]
		s.next[c.stream] = end
	} else {
		s.next[c.stream] = end
	}
	d := &pb.ProcessEvent_DataEvent{}
	switch c.stream {
	case streamStdout:
		d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: c.data}
	case streamStderr:
		d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: c.data}
	default:
		d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: c.data}
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}
}

// follow sends p's events to one caller until p ends (its end event
// last) or the caller goes away; p runs on either way.
func (a *Agent) follow(ctx context.Context, p *process, from [numStreams]uint64, send func(*pb.ProcessEvent) error) error {
	s, replay, offs, end := p.subscribe(from)
	defer p.unsubscribe(s)
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{
		Pid: uint32(p.pid), StdoutOffset: offs[streamStdout], StderrOffset: offs[streamStderr], PtyOffset: offs[streamPTY],
	}}}); err != nil {
		return err
	}
	deliver := func(c chunk) error {
		for len(c.data) > 0 {
			n := min(len(c.data), chunkSize)
			if ev := s.dataEvent(chunk{stream: c.stream, off: c.off, data: c.data[:n]}); ev != nil {
				if err := send(ev); err != nil {
					return err
				}
			}
			c.off += uint64(n)
			c.data = c.data[n:]
		}
		return nil
	}
	for _, c := range replay {
		if err := deliver(c); err != nil {
			return err
		}
	}
	if end != nil {
		return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
	}
	keep := time.NewTicker(keepAliveEvery)
	defer keep.Stop()
	for {
		select {
		case c := <-s.ch:
			if err := deliver(c); err != nil {
				return err
			}
		case <-p.done:
			// Every pump has handed its last chunk over: drain them.
			for {
				select {
				case c := <-s.ch:
					if err := deliver(c); err != nil {
						return err
					}
					continue
				default:
				}
				break
			}
			p.mu.Lock()
			end := p.end
			p.mu.Unlock()
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
		case <-keep.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Output is read and sent in chunks: each event and its trip to the host
// costs a fixed few system calls, each a trap into gVisor's sentry, so a
// bulk writer's output goes in large ones (32 KiB chunks streamed at
// ≈ 45 MB/s, 256 KiB at ≈ 150; bench/README.md). A process starts with a
// small read buffer, which grows while reads fill it: an interactive one
// keeps 32 KiB per stream.
const (
	// chunkSize is the most output one event carries.
	chunkSize = 256 << 10
	// firstReadSize is a stream's first read buffer.
	firstReadSize = 32 << 10
	// pipeSize is the capacity asked for a process's output pipes.
	pipeSize = 1 << 20
)

// startFailure is a process that could not start: what to tell its
// caller instead of following it.
type startFailure struct {
	stderr string
	end    *pb.ProcessEvent_EndEvent
}

// spawn starts the process of req, as u when it is not nil. A process that
// cannot start (a bad working directory, a command that is not found) is a
// startFailure, not an error: its caller hears it as the process's end.
func (a *Agent) spawn(req *pb.StartRequest, u *account) (*process, *startFailure, error) {
	cfg := req.GetProcess()
	if cfg.GetCmd() == "" {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New("empty command"))
	}
	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	extra := make([]string, 0, len(cfg.GetEnvs()))
	for k, v := range cfg.GetEnvs() {
		extra = append(extra, k+"="+v)
	}
	// The request's own variables win over the user's, as over the base.
	env := mergeEnv(a.opts.Env, u.env(), extra)
	tty := req.GetPty() != nil
	if tty && envValue(env, "TERM") == "" {
		env = append(env, "TERM=xterm-256color")
	}
	// A user's process starts in, and resolves a relative cwd against,
	// its home (envd's rule).
	// A user whose home does not exist (nobody's /nonexistent, an image's
	// service user) starts in / when no cwd is asked, as login(1) does.
	dir := cfg.GetCwd()
	switch {
	case u != nil && dir == "" && !isDir(u.home):
		dir = "/"
	case u != nil && !filepath.IsAbs(dir):
		dir = filepath.Join(u.home, dir)
	case dir == "":
		dir = a.opts.Cwd
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		msg := fmt.Sprintf("working directory %s: not a directory", dir)
		if err != nil {
			msg = fmt.Sprintf("working directory %s: %v", dir, errors.Unwrap(err))
		}
		return nil, &startFailure{end: &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: "not started", Error: &msg}}, nil
	}
	path, err := lookPath(argv[0], envValue(env, "PATH"), dir)
	if err != nil {
		code := 127
		if errors.Is(err, errNotExecutable) {
			code = 126
		}
		return nil, &startFailure{
			stderr: fmt.Sprintf("sandbox-agent: %s: %v\n", argv[0], err),
			end:    &pb.ProcessEvent_EndEvent{ExitCode: int32(code), Status: err.Error(), NotFound: code == 127},
		}, nil
	}
	tag := req.GetTag()
	if !a.procs.claimTag(tag) {
		return nil, nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("a running process has tag %q", tag))
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Dir: dir}
	withStdin := req.Stdin == nil || req.GetStdin()

	var (
		stdinW  io.WriteCloser // where input goes
		readers []*os.File     // output sources: (stdout, stderr) or the pty
		toClose []*os.File     // child ends to close after start
		ptyFile *os.File
	)
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	failed := func(err error) (*process, *startFailure, error) {
		a.procs.releaseTag(tag)
		msg := fmt.Sprintf("start %s: %v", argv[0], err)
		return nil, &startFailure{end: &pb.ProcessEvent_EndEvent{ExitCode: 126, Status: "not started", Error: &msg}}, nil
	}
	startFn := cmd.Start
	var ttySig *ttySignaller
	if tty {
		rows, cols := uint16(req.GetPty().GetSize().GetRows()), uint16(req.GetPty().GetSize().GetCols())
		if rows == 0 || cols == 0 {
			rows, cols = 24, 80
		}
		if a.ttySelf != "" {
			helperEnd, s, err := underTTYSession(cmd, a.ttySelf, argv)
			if err != nil {
				return failed(err)
			}
			toClose, ttySig = append(toClose, helperEnd), s
		}
		startFn = func() error {
			f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
			ptyFile = f
			return err
		}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		outR, outW, err := os.Pipe()
		if err != nil {
			return failed(err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{outR, outW})
			return failed(err)
		}
		for _, r := range []*os.File{outR, errR} {
			// A bulk writer then fills more than the default 64 KiB
			// between two of our reads, so each read, event and
			// round trip carries more (bench/README.md: output
			// streaming). Only a best effort: a smaller pipe works.
			_, _ = unix.FcntlInt(r.Fd(), unix.F_SETPIPE_SZ, pipeSize)
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		readers = []*os.File{outR, errR}
		toClose = []*os.File{outW, errW}
		if withStdin {
			inR, inW, err := os.Pipe()
			if err != nil {
				closeAll(append(readers, toClose...))
				return failed(err)
			}
			cmd.Stdin = inR
			toClose = append(toClose, inR)
			stdinW = inW
		}
	}
	if u != nil {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{} // pty's start keeps it
		}
		cmd.SysProcAttr.Credential = u.credential()
	}
	a.placeInCgroup(cmd)
	oomBefore, oomCounted := a.oomKills()
	wait, err := a.procs.start(cmd, startFn)
	closeAll(toClose)
	if err != nil {
		closeAll(readers)
		if stdinW != nil {
			stdinW.Close()
		}
		if ttySig != nil {
			ttySig.close()
		}
		return failed(err)
	}
	if tty {
		ptyFile = pollable(ptyFile)
		readers = []*os.File{ptyFile}
		if withStdin {
			stdinW = ptyFile
		}
	}
	p := &process{
		pid: cmd.Process.Pid, tag: tag, cfg: cfg, started: time.Now(), pty: ptyFile, stdin: stdinW, ttySig: ttySig,
		done: make(chan struct{}), subs: map[*subscriber]struct{}{},
	}
	for i := range p.out {
		p.out[i].max = a.opts.TailBytes
	}
	a.procs.add(p)
	go a.supervise(p, cmd, readers, wait, time.Duration(req.GetTimeoutMs())*time.Millisecond, oomBefore, oomCounted)
	return p, nil, nil
}

// supervise pumps p's output, enforces its timeout and records its end.
func (a *Agent) supervise(p *process, cmd *exec.Cmd, readers []*os.File, wait <-chan syscall.WaitStatus, timeout time.Duration, oomBefore uint64, oomCounted bool) {
	var outWG sync.WaitGroup
	pumps := make([]*pump, len(readers))
	for i, r := range readers {
		stream := streamStdout
		switch {
		case p.pty != nil:
			stream = streamPTY
		case i == 1:
			stream = streamStderr
		}
		pm := &pump{r: r}
		pumps[i] = pm
		outWG.Add(1)
		go func() {
			defer outWG.Done()
			defer pm.done.Store(true)
			buf := make([]byte, firstReadSize)
			for {
				pm.since.Store(time.Now().UnixNano())
				pm.reading.Store(true)
				n, err := r.Read(buf)
				pm.reading.Store(false)
				if n > 0 {
					p.publish(stream, buf[:n])
				}
				if n == len(buf) && len(buf) < chunkSize {
					// A process that writes in bulk: read more at once.
					buf = make([]byte, min(2*len(buf), chunkSize))
				}
				if err != nil {
					return
				}
			}
		}()
	}
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	var ws syscall.WaitStatus
	for done := false; !done; {
		select {
		case ws = <-wait:
			done = true
		case <-timer:
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			killSession(p.pid, syscall.SIGKILL)
			timer = nil
		}
	}
	p.mu.Lock()
	timedOut, oom := p.timedOut, p.oomKilled
	p.mu.Unlock()
	if timedOut {
		// Nothing a timed-out session started keeps running unobserved.
		killSession(p.pid, syscall.SIGKILL)
	}
	outDone := make(chan struct{})
	go func() { outWG.Wait(); close(outDone) }()
	a.drain(p.pid, pumps, outDone)
	closeAll(readers)
	if p.ttySig != nil {
		p.ttySig.close()
	}
	p.mu.Lock()
	if p.stdin != nil && p.stdin != p.pty && !p.stdinShut {
		p.stdin.Close()
		p.stdinShut = true
	}
	p.mu.Unlock()
	_ = cmd.Process.Release()
	if !oom && oomCounted && killedLike(ws) {
		// The kernel's OOM killer (a microVM's cgroup at its memory.max)
		// took this session's leader or one of its children while it ran.
		// Another session's kill in the same window would be counted
		// too; a cgroup per session would tell them apart.
		if after, ok := a.oomKills(); ok && after > oomBefore {
			oom = true
		}
	}
	end := &pb.ProcessEvent_EndEvent{ExitCode: int32(ws.ExitStatus()), Exited: true, Status: fmt.Sprintf("exit status %d", ws.ExitStatus()), TimedOut: timedOut, OomKilled: oom}
	if ws.Signaled() {
		end.Signal = int32(ws.Signal())
		end.ExitCode = 128 + end.Signal
		end.Status = "signal: " + ws.Signal().String()
	}
	p.mu.Lock()
	p.end, p.ended = end, time.Now()
	p.mu.Unlock()
	close(p.done)
	a.procs.finished(p)
}

// pump reads one output stream of a process.
type pump struct {
	r       *os.File
	reading atomic.Bool  // blocked in Read (not handing output over)
	since   atomic.Int64 // when the current Read began, unix nanoseconds
	done    atomic.Bool
}

// drain waits, after the process exited, for its output to be read to the
// end and handed over (a slow follower is waited for: it holds the pump,
// not the output). A pump whose read has waited outputGrace since the
// exit without data is held by a background child that inherited the
// stream: its read is interrupted. One whose read cannot be interrupted
// (a terminal some kernels cannot poll) is left after three graces; what
// it still reads goes to the tail only.
func (a *Agent) drain(pid int, pumps []*pump, outDone <-chan struct{}) {
	exited := time.Now()
	tick := time.NewTicker(outputGrace / 4)
	defer tick.Stop()
	for {
		select {
		case <-outDone:
			return
		case <-tick.C:
		}
		now := time.Now()
		stuck, open := 0, 0
		for _, pm := range pumps {
			if pm.done.Load() {
				continue
			}
			open++
			if !pm.reading.Load() {
				continue
			}
			from := time.Unix(0, pm.since.Load())
			if from.Before(exited) {
				from = exited
			}
			idle := now.Sub(from)
			if idle > outputGrace {
				_ = pm.r.SetReadDeadline(now)
			}
			if idle > 3*outputGrace {
				stuck++
			}
		}
		if open > 0 && stuck == open {
			a.log.Warn("output reader still blocked after exit", "pid", pid)
			return
		}
	}
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// processService is the process API (envd's), served to the host.
type processService struct{ a *Agent }

func (s processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	u, err := s.a.requestUser(req.Header())
	if err != nil {
		return err
	}
	p, early, err := s.a.spawn(req.Msg, u)
	if err != nil {
		return err
	}
	if early != nil {
		if early.stderr != "" {
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: []byte(early.stderr)}}}}); err != nil {
				return err
			}
		}
		return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: early.end}})
	}
	return s.a.follow(ctx, p, [numStreams]uint64{}, send)
}

func (s processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	from := [numStreams]uint64{req.Msg.GetStdoutFrom(), req.Msg.GetStderrFrom(), req.Msg.GetPtyFrom()}
	return s.a.follow(ctx, p, from, func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) })
}

func (s processService) List(context.Context, *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	var out []*pb.ProcessInfo
	for _, p := range s.a.procs.running() {
		info := &pb.ProcessInfo{Config: p.cfg, Pid: uint32(p.pid), Started: timestamppb.New(p.started), Pty: p.pty != nil}
		if p.tag != "" {
			info.Tag = &p.tag
		}
		out = append(out, info)
	}
	return connect.NewResponse(&pb.ListResponse{Processes: out}), nil
}

// find resolves a selector to a process the agent started.
func (s processService) find(sel *pb.ProcessSelector) (*process, error) {
	var p *process
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		p = s.a.procs.lookup(int(v.Pid), "")
	case *pb.ProcessSelector_Tag:
		p = s.a.procs.lookup(0, v.Tag)
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no process selected"))
	}
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such process"))
	}
	return p, nil
}

// running is find for a process that must still run.
func (s processService) running(sel *pb.ProcessSelector) (*process, error) {
	p, err := s.find(sel)
	if err != nil {
		return nil, err
	}
	if !p.running() {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
	}
	return p, nil
}

func (s processService) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.running(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if p.pty == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal", p.pid))
		}
		if size.GetRows() == 0 || size.GetCols() == 0 || size.GetRows() > 0xffff || size.GetCols() > 0xffff {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("terminal size %dx%d", size.GetCols(), size.GetRows()))
		}
		setWinsize(p.pty, uint16(size.GetRows()), uint16(size.GetCols()), p.pid, p.ttySig)
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// input writes to p's input.
func (s processService) input(p *process, in *pb.ProcessInput) error {
	var b []byte
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		b = v.Stdin
	case *pb.ProcessInput_Pty:
		b = v.Pty
	}
	p.mu.Lock()
	w, shut := p.stdin, p.stdinShut
	p.mu.Unlock()
	if w == nil || shut {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d takes no input", p.pid))
	}
	if err := p.write(w, b); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("input to process %d: %w", p.pid, err))
	}
	return nil
}

// write writes input to w, p's input: on a terminal whose signals a
// tty-session helper sends, through writeTTY.
func (p *process) write(w io.Writer, b []byte) error {
	if p.ttySig != nil && w == io.Writer(p.pty) {
		return writeTTY(p.pty, p.ttySig, b)
	}
	_, err := w.Write(b)
	return err
}

func (s processService) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.running(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := s.input(p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (s processService) StreamInput(_ context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := s.running(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event"))
			}
			if err := s.input(p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (s processService) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.running(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stdin == nil || p.stdinShut:
	case p.stdin == p.pty:
		_, _ = p.pty.Write([]byte{4}) // ^D: end of file for the terminal's reader
	default:
		p.stdin.Close()
		p.stdinShut = true
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (s processService) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := s.running(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	sig := int(req.Msg.GetSignal())
	if sig <= 0 || sig > 64 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %d", sig))
	}
	killSession(p.pid, syscall.Signal(sig))
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// isDir reports whether path is a directory.
func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

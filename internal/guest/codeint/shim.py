# sandboxd's code-interpreter shim: runs inside a sandbox, as the sandbox's
# user, started by the guest agent (package codeint), and drives Jupyter
# kernels for it with jupyter_client over Unix sockets (transport "ipc": no
# TCP port is opened, so nothing else in the sandbox or outside it can reach
# a kernel, and a sandbox with kernels can be paused).
#
# It speaks newline-delimited JSON: requests on stdin, events on stdout.
# Every request has an "id" that the events it causes carry:
#   {"id", "op": "start", "ctx", "kernel", "cwd", "env"}  -> started | failed
#   {"id", "op": "execute", "ctx", "code", "env"}         -> count, stream,
#        result, error ... then done (or died: the kernel exited)
#   {"id", "op": "interrupt", "ctx"}                      -> (nothing)
#   {"id", "op": "restart", "ctx"}                        -> restarted | failed
#   {"id", "op": "shutdown", "ctx"}                       -> removed
# Output is bounded here, in the sandbox, before it is written: a value of a
# result or a stream message larger than its limit is replaced by a note.
import ctypes
import json
import os
import queue
import signal
import tempfile
import threading
import time

from jupyter_client.manager import KernelManager

MAX_VALUE = int(os.environ.get("SANDBOXD_CODE_MAX_VALUE", str(10 << 20)))
MAX_STREAM = int(os.environ.get("SANDBOXD_CODE_MAX_STREAM", str(1 << 20)))

# The channels are private descriptors: fds 0 and 1 are pointed elsewhere,
# so nothing a kernel inherits (a stray write of a library, a cell's
# os.system) can reach the agent's channel or read its requests.
_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
_null = os.open(os.devnull, os.O_RDWR)
os.dup2(_null, 0)
os.dup2(2, 1)
_out_lock = threading.Lock()


def emit(ev):
    line = json.dumps(ev, ensure_ascii=False, separators=(",", ":"))
    with _out_lock:
        _out.write(line + "\n")
        _out.flush()


# Run silently in every Python kernel once it is ready: results keep their
# full text, and pandas DataFrames and matplotlib figures get the extra
# representations E2B's clients read (e2b/data, e2b/chart). Nothing heavy is
# imported here: the formatters are registered by type name, so pandas and
# matplotlib load only when a cell uses them.
PYTHON_SETUP = r'''
def _sandboxd_setup():
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode
    ip = get_ipython()
    ip.run_line_magic("colors", "NoColor")
    ip.display_formatter.formatters["text/plain"].max_seq_length = 0

    def new_formatter(mime):
        class _F(BaseFormatter):
            format_type = Unicode(mime)
            print_method = ObjectName("_repr_" + mime.replace("/", "_") + "_")
            _return_type = dict
        f = _F(parent=ip.display_formatter)
        ip.display_formatter.formatters[mime] = f
        return f

    def frame_data(df):
        out = {}
        for col in df.columns:
            vals = []
            for v in df[col].tolist():
                if hasattr(v, "isoformat"):
                    v = v.isoformat()
                elif v != v:
                    v = None
                vals.append(v)
            out[str(col)] = vals
        return out

    new_formatter("e2b/data").for_type_by_name("pandas.core.frame", "DataFrame", frame_data)

    def figure_chart(fig):
        try:
            return _sandboxd_chart(fig)
        except Exception:
            return {}

    chart = new_formatter("e2b/chart")
    chart.for_type_by_name("matplotlib.figure", "Figure", figure_chart)

    # Setting up matplotlib's inline backend (on the first import of
    # pyplot) takes every formatter's printer for Figure away, ours too:
    # it is put back after.
    import sys
    from IPython.core import pylabtools
    select = pylabtools.select_figure_formats

    def select_figure_formats(*args, **kwargs):
        select(*args, **kwargs)
        chart.for_type_by_name("matplotlib.figure", "Figure", figure_chart)

    pylabtools.select_figure_formats = select_figure_formats
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None and getattr(inline, "select_figure_formats", None) is select:
        inline.select_figure_formats = select_figure_formats


def _sandboxd_chart(fig):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle, Wedge

    def num(v):
        try:
            return float(v)
        except (TypeError, ValueError):
            return str(v)

    def chart_of(ax):
        c = {"title": ax.get_title() or None, "x_label": ax.get_xlabel() or None,
             "y_label": ax.get_ylabel() or None, "elements": []}
        kids = ax.get_children()
        lines = [k for k in ax.get_lines() if not k.get_label().startswith("_")] or list(ax.get_lines())
        wedges = [k for k in kids if isinstance(k, Wedge)]
        scatters = [k for k in ax.collections if isinstance(k, PathCollection)]
        bars = [p for p in ax.patches if isinstance(p, Rectangle)]
        if wedges:
            c["type"] = "pie"
            texts = [t.get_text() for t in ax.texts]
            for i, w in enumerate(wedges):
                c["elements"].append({"label": texts[i] if i < len(texts) else str(i),
                                      "angle": num(abs(w.theta2 - w.theta1)), "radius": num(w.r)})
            for k in ("x_label", "y_label"):
                c.pop(k)
        elif scatters and not ax.get_lines():
            c["type"] = "scatter"
            for s in scatters:
                pts = [[num(x), num(y)] for x, y in s.get_offsets().tolist()]
                c["elements"].append({"label": s.get_label(), "points": pts})
        elif ax.get_lines() and not bars:
            c["type"] = "line"
            for ln in lines:
                xs, ys = ln.get_xdata(), ln.get_ydata()
                c["elements"].append({"label": ln.get_label(),
                                      "points": [[num(x), num(y)] for x, y in zip(xs, ys)]})
        elif bars:
            c["type"] = "bar"
            labels = [t.get_text() for t in ax.get_xticklabels()]
            ticks = list(ax.get_xticks())
            for b in bars:
                x = b.get_x() + b.get_width() / 2
                label = str(num(x))
                for t, l in zip(ticks, labels):
                    if abs(t - x) < 1e-9 and l:
                        label = l
                c["elements"].append({"label": label, "value": num(b.get_height()),
                                      "group": b.get_label() if not b.get_label().startswith("_") else ""})
        else:
            c["type"] = "unknown"
        if c["type"] in ("line", "scatter"):
            c["x_scale"], c["y_scale"] = ax.get_xscale(), ax.get_yscale()
            c["x_ticks"] = [num(t) for t in ax.get_xticks()]
            c["y_ticks"] = [num(t) for t in ax.get_yticks()]
            c["x_tick_labels"] = [t.get_text() for t in ax.get_xticklabels()]
            c["y_tick_labels"] = [t.get_text() for t in ax.get_yticklabels()]
        return c

    axes = fig.get_axes()
    if not axes:
        return {}
    if len(axes) == 1:
        return chart_of(axes[0])
    return {"type": "superchart", "title": fig._suptitle.get_text() if fig._suptitle else None,
            "elements": [chart_of(a) for a in axes]}


_sandboxd_setup()
del _sandboxd_setup
'''


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def die_with_parent():
    """Run in a kernel's child before exec: jupyter_client puts each kernel
    in a session of its own, so the agent's kill of this shim's session
    would leave it running (ipykernel watches its parent, other kernels
    do not). The signal comes when the thread that started it ends: the
    context's, which lives until the kernel is shut down."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def literal(value, language):
    """value (str, dict or list of str) as a literal of the kernel's language."""
    if language == "python":
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def env_snippets(language, env, base):
    """Code that sets env in the kernel, and code that puts the variables
    back as base has them; None when the language has no way known here."""
    keep = {k: base[k] for k in env if k in base}
    drop = [k for k in env if k not in base]
    if language == "python":
        return ("import os as _sbx_os; _sbx_os.environ.update(%s); del _sbx_os" % literal(env, language),
                "import os as _sbx_os; _sbx_os.environ.update(%s)\nfor _sbx_k in %s: _sbx_os.environ.pop(_sbx_k, None)\ndel _sbx_os, _sbx_k"
                % (literal(keep, language), literal(drop, language)))
    if language in ("javascript", "typescript"):
        return ("Object.assign(process.env, %s);" % literal(env, language),
                "Object.assign(process.env, %s); for (const k of %s) delete process.env[k];"
                % (literal(keep, language), literal(drop, language)))
    if language == "r":
        def setenv(pairs):
            return "Sys.setenv(%s)\n" % ", ".join("`%s` = %s" % (k, json.dumps(v, ensure_ascii=False)) for k, v in pairs.items()) if pairs else ""
        back = setenv(keep)
        if drop:
            back += "Sys.unsetenv(c(%s))\n" % ", ".join(json.dumps(k) for k in drop)
        return setenv(env), back
    if language == "bash":
        sets = "".join("export %s=%s\n" % (k, shell_quote(v)) for k, v in env.items())
        back = "".join("export %s=%s\n" % (k, shell_quote(v)) for k, v in keep.items())
        back += "".join("unset %s\n" % k for k in drop)
        return sets, back
    return None


def shell_quote(v):
    return "'" + v.replace("'", "'\"'\"'") + "'"


def cut(value, limit, what):
    """value, or a note in its place when it is over limit bytes."""
    size = len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else len(json.dumps(value))
    if size <= limit:
        return value, None
    return None, "[sandboxd: %s of %d bytes left out: at most %d bytes each]" % (what, size, limit)


class Context:
    def __init__(self, ctx_id, kernel, cwd, env, rundir):
        self.id = ctx_id
        self.kernel = kernel
        self.cwd = cwd
        self.env = env
        self.rundir = rundir
        self.ops = queue.Queue()
        self.km = None
        self.kc = None
        self.language = ""
        self.busy = False
        self.killed = None  # why the kernel was killed under a running cell
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    # Called from the reading thread, never blocks.
    def kernel_pid(self):
        try:
            return self.km.provisioner.process.pid
        except Exception:
            return None

    def signal(self, sig):
        pid = self.kernel_pid()
        if pid is None:
            return
        try:
            os.killpg(os.getpgid(pid), sig)
        except OSError:
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def loop(self):
        while True:
            req = self.ops.get()
            op = req["op"]
            try:
                if op == "start":
                    self.start(req)
                elif op == "execute":
                    self.execute(req)
                elif op == "restart":
                    self.restart(req)
                elif op == "shutdown":
                    self.shutdown(req)
                    return
            except Exception as e:  # report, never die: the agent waits
                emit({"id": req["id"], "ev": "failed", "message": "%s: %s" % (type(e).__name__, e)})
                if op == "start":
                    return  # no kernel: the agent forgets the context

    def start(self, req):
        # Python kernels (pyzmq) take Unix sockets; other kernels' ZeroMQ
        # bindings may not (tslab's builds tcp:// addresses), so they listen
        # on the sandbox's loopback. Either way every message is signed
        # with the kernel's key, which only the connection file (0600, in
        # this shim's private directory) holds.
        spec = KernelManager(kernel_name=self.kernel).kernel_spec
        python = os.path.basename(spec.argv[0]).startswith("python") if spec.argv else False
        self.km = KernelManager(kernel_name=self.kernel, transport="ipc" if python else "tcp")
        self.km.connection_file = os.path.join(self.rundir, self.id + ".json")
        env = dict(self.env)
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        self.km.start_kernel(cwd=self.cwd, env=env, preexec_fn=die_with_parent)
        self.language = (self.km.kernel_spec.language or self.kernel).lower()
        self.connect()
        emit({"id": req["id"], "ev": "started", "language": self.language})

    def connect(self):
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        if self.language == "python":
            self.run_silent(PYTHON_SETUP)

    def run_silent(self, code):
        """Runs code that no one sees: no output, no execution count."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                if not self.km.is_alive():
                    return
                continue
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                    and msg["content"].get("execution_state") == "idle":
                break
        self.drain_shell()

    def drain_shell(self):
        while True:
            try:
                self.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                return

    def execute(self, req):
        rid = req["id"]
        if not self.km.is_alive():
            emit({"id": rid, "ev": "error", "ename": "ContextDied",
                  "evalue": "the context's kernel is not running (exit %s); restart the context" % self.exit_code(),
                  "traceback": []})
            emit({"id": rid, "ev": "done"})
            return
        env = req.get("env") or {}
        snippets = env_snippets(self.language, env, self.env) if env else None
        if env and snippets is None:
            emit({"id": rid, "ev": "error", "ename": "EnvNotSupported",
                  "evalue": "per-execution environment variables are not supported for %s" % self.language, "traceback": []})
            emit({"id": rid, "ev": "done"})
            return
        self.busy, self.killed = True, None
        try:
            if snippets:
                self.run_silent(snippets[0])
            self.run_cell(rid, req["code"])
            if snippets and self.km.is_alive():
                self.run_silent(snippets[1])
        finally:
            self.busy = False

    def exit_code(self):
        try:
            return self.km.provisioner.process.poll()
        except Exception:
            return "unknown"

    def run_cell(self, rid, code):
        msg_id = self.kc.execute(code, silent=False, store_history=True, allow_stdin=False, stop_on_error=True)
        errored = False
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.25)
            except queue.Empty:
                if not self.km.is_alive():
                    if self.killed:
                        emit({"id": rid, "ev": "error", "ename": self.killed[0], "evalue": self.killed[1], "traceback": []})
                    else:
                        emit({"id": rid, "ev": "error", "ename": "ContextDied",
                              "evalue": "the context's kernel exited (%s) while the code ran; its state is lost: restart the context" % self.exit_code(),
                              "traceback": []})
                    emit({"id": rid, "ev": "died"})
                    return
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "execute_input":
                emit({"id": rid, "ev": "count", "n": content.get("execution_count")})
            elif kind == "stream":
                # A kernel batches a fast writer's output: a batch past the
                # bound keeps its start, then says how much was left out.
                text = content.get("text", "")
                if len(text) > MAX_STREAM:
                    text = text[:MAX_STREAM] + "\n[sandboxd: %d more characters of this write left out]\n" % (len(text) - MAX_STREAM)
                emit({"id": rid, "ev": "stream", "name": content.get("name", "stdout"), "text": text,
                      "time": str(msg["header"].get("date", ""))})
            elif kind in ("display_data", "execute_result"):
                data, notes = {}, []
                for mime, value in (content.get("data") or {}).items():
                    kept, note = cut(value, MAX_VALUE, mime)
                    if note is None:
                        data[mime] = kept
                    else:
                        notes.append(note)
                if notes:
                    data["text/plain"] = "\n".join(filter(None, [data.get("text/plain")] + notes))
                emit({"id": rid, "ev": "result", "data": data, "main": kind == "execute_result"})
            elif kind == "error":
                if not errored:
                    errored = True
                    emit({"id": rid, "ev": "error", "ename": content.get("ename", ""), "evalue": content.get("evalue", ""),
                          "traceback": content.get("traceback", [])})
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        # The reply says whether the cell was aborted, or failed without an
        # error message on iopub.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                reply = self.kc.get_shell_msg(timeout=0.25)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") != msg_id:
                continue
            status = reply["content"].get("status")
            if status == "error" and not errored:
                c = reply["content"]
                emit({"id": rid, "ev": "error", "ename": c.get("ename", ""), "evalue": c.get("evalue", ""),
                      "traceback": c.get("traceback", [])})
            elif status in ("abort", "aborted") and not errored:
                emit({"id": rid, "ev": "error", "ename": "ExecutionAborted", "evalue": "Execution was aborted", "traceback": []})
            break
        emit({"id": rid, "ev": "done"})

    def restart(self, req):
        if self.kc is not None:
            self.kc.stop_channels()
        self.km.restart_kernel(now=True)
        self.connect()
        emit({"id": req["id"], "ev": "restarted"})

    def shutdown(self, req):
        try:
            if self.kc is not None:
                self.kc.stop_channels()
            if self.km is not None and self.km.has_kernel:
                self.km.shutdown_kernel(now=True)
        finally:
            emit({"id": req["id"], "ev": "removed"})


def main():
    rundir = tempfile.mkdtemp(prefix="sbx-code-")
    contexts = {}
    for line in _in:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            rid, op, ctx_id = req["id"], req["op"], req["ctx"]
        except (ValueError, KeyError, TypeError) as e:
            emit({"id": None, "ev": "failed", "message": "bad request: %s" % e})
            continue
        ctx = contexts.get(ctx_id)
        if op == "start":
            if ctx is not None:
                emit({"id": rid, "ev": "failed", "message": "context %s exists" % ctx_id})
                continue
            contexts[ctx_id] = ctx = Context(ctx_id, req.get("kernel") or "python3", req.get("cwd") or None,
                                             req.get("env") or dict(os.environ), rundir)
            ctx.ops.put(req)
            continue
        if ctx is None:
            emit({"id": rid, "ev": "failed", "message": "no context %s" % ctx_id})
            continue
        if op == "interrupt":
            ctx.signal(signal.SIGINT)
        elif op in ("restart", "shutdown"):
            if ctx.busy:
                # A cell still runs: it ends now, with this as its error.
                ctx.killed = ("ContextRestarting", "Context was restarted") if op == "restart" else \
                    ("ContextRemoved", "Context was removed")
                ctx.signal(signal.SIGKILL)
            if op == "shutdown":
                del contexts[ctx_id]
            ctx.ops.put(req)
        elif op == "execute":
            ctx.ops.put(req)
        else:
            emit({"id": rid, "ev": "failed", "message": "unknown op %s" % op})
    # stdin closed: the agent is gone or done with us.
    for ctx in contexts.values():
        ctx.signal(signal.SIGKILL)


if __name__ == "__main__":
    main()

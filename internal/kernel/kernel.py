"""sandloop kernel: runs code cells like a notebook, inside a jail.

Standard library only. The Go side (internal/kernel) starts this program with:
  fd 3  requests, one JSON object per line
  fd 4  events, one JSON object per line
  fd 5, fd 6  pipes the Go side reads as the cell's stdout and stderr; the
        kernel moves them to fds 1 and 2
The first request is a hello with settings and a random token. Requests
between cells (checkpoint, restore, drop_checkpoint, checkpoint_memory,
export_state, import_state; see "checkpoints" and "state" below) may carry a
tag, echoed in their replies. Output is
flushed to the pipes before each batch of events. A batch in the middle of a
cell (display(), plt.show()) is preceded by a marker on both output pipes
(see _send), so output written at the descriptor level (C code,
subprocesses) keeps its place around it; the last batch of a cell (main
result, error, end) takes all the output before it.
"""

import ast
import base64
import builtins
import fcntl
import gc
import io
import json
import linecache
import os
import resource
import signal
import socket
import stat
import struct
import sys
import threading
import time
import traceback
import types

KERNEL_FILE = os.path.abspath(__file__) if "__file__" in globals() else "<kernel>"

_MIME_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
)
_BINARY_MIMES = ("image/png", "image/jpeg")
_PLAIN_TYPES = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set)


class StdinNotImplementedError(EOFError):
    """input() was called, but a sandboxed kernel has no stdin."""


class _State:
    in_user = False  # SIGINT raises KeyboardInterrupt only while user code runs
    seq = 0
    token = b""
    out_fd = -1
    err_fd = -1
    sending = False  # the main thread is writing events: defer the interrupt
    deferred = False
    main_ident = threading.get_ident()
    count = 0
    max_event = 16 << 20
    req = None  # the request reader (_Reader)
    ev_fd = -1
    tag = 0  # of the request between cells being answered: echoed in its replies
    first_pid = 0  # the process the host signals and waits for (see _become_anchor)
    jailed = False  # started by PID 1 (a jail's init): every process we see is the session's
    clear_refs_fd = -1
    child_cpu = 0.0
    child_peak = 0
    lock = threading.Lock()
    shown = set()  # ids of figures already emitted in this cell
    state_sock = None  # the state channel (fd 7), where the host gave one


S = _State()


# ---------------------------------------------------------------- protocol


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _flush_stdio():
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if f is not None:
                f.flush()
        except Exception:
            pass


def _send(*events, mark=True):
    """Write a batch of events (dicts, or JSON text).

    With mark, a marker "\\x1b]sl;TOKEN;SEQ\\x07" goes to both output pipes
    first and the events carry SEQ: the Go side delivers the output before
    the marker, then the events, then the output after it. The last batch of
    a cell needs no marker: the Go side takes everything before the end.

    A KeyboardInterrupt is held back while the main thread writes, so that it
    never leaves half an event on the channel.
    """
    main = threading.get_ident() == S.main_ident
    if main:
        S.sending = True
    try:
        with S.lock:
            # Output buffered by Python goes to the pipes before the events.
            _flush_stdio()
            seq = 0
            if mark:
                S.seq += 1
                seq = S.seq
                marker = b"\x1b]sl;" + S.token + b";" + str(seq).encode() + b"\x07"
                _write_all(S.out_fd, marker)
                _write_all(S.err_fd, marker)
            lines = []
            for ev in events:
                if type(ev) is not str:
                    if seq:
                        ev["seq"] = seq
                    ev = _encode(ev)
                lines.append(ev + "\n")
            _write_all(S.ev_fd, "".join(lines).encode())
    finally:
        if main:
            S.sending = False
            if S.deferred:
                S.deferred = False
                if S.in_user:
                    raise KeyboardInterrupt


def _reply(ev):
    """Write a reply to a request that runs no user code."""
    if S.tag:
        ev["tag"] = S.tag
    with S.lock:
        _write_all(S.ev_fd, _encode(ev).encode() + b"\n")


_encode = json.JSONEncoder(separators=(",", ":")).encode


# ---------------------------------------------------------------- display


def _mime_bundle(obj):
    """Return the MIME bundle of obj, as IPython's display formatter would."""
    if type(obj) in _PLAIN_TYPES:
        return {"text/plain": repr(obj)}
    data = {}
    fig_mod = sys.modules.get("matplotlib.figure")
    if fig_mod is not None and isinstance(obj, fig_mod.Figure):
        png = _figure_png(obj)
        if png is not None:
            data["image/png"] = png
            S.shown.add(id(obj))
    method = _repr_method(obj, "_repr_mimebundle_")
    if method is not None:
        try:
            bundle = method(include=None, exclude=None)
            if isinstance(bundle, tuple):
                bundle = bundle[0]
            if isinstance(bundle, dict):
                for mime, value in bundle.items():
                    _put(data, mime, value)
        except Exception:
            pass
    for mime, name in _MIME_METHODS:
        if mime in data:
            continue
        method = _repr_method(obj, name)
        if method is None:
            continue
        try:
            value = method()
        except Exception:
            continue
        if isinstance(value, tuple):  # (data, metadata)
            value = value[0]
        _put(data, mime, value)
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception:
            pass
    return data


def _repr_method(obj, name):
    # Look the method up on the type, so objects answering every attribute
    # (mocks, proxies) do not produce bogus representations.
    try:
        if getattr(type(obj), name, None) is None:
            return None
        method = getattr(obj, name)
    except Exception:
        return None
    return method if callable(method) else None


def _put(data, mime, value):
    if value is None:
        return
    if mime in _BINARY_MIMES:
        if isinstance(value, (bytes, bytearray)):
            value = base64.b64encode(value).decode("ascii")
        elif not isinstance(value, str):
            return
    elif mime == "application/json" or mime.endswith("+json"):
        if not isinstance(value, str):
            try:
                value = json.dumps(value)
            except Exception:
                return
    elif isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    elif not isinstance(value, str):
        return
    data[mime] = value


def _result_event(data, main):
    size = sum(len(v) for v in data.values())
    if size > S.max_event:
        data = {"text/plain": "[output too large to display: %d bytes]" % size}
    return {"type": "result", "is_main_result": main, "data": data}


def display(*objs, raw=False, **_ignored):
    """Show objects as rich results, as IPython's display() does.

    With raw=True each object is a MIME bundle (a dict of MIME type to data).
    """
    for obj in objs:
        if raw and isinstance(obj, dict):
            data = {}
            for mime, value in obj.items():
                _put(data, mime, value)
        else:
            data = _mime_bundle(obj)
        if data:
            _send(_result_event(data, False))


# ---------------------------------------------------------------- matplotlib


def _figure_png(fig):
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return base64.b64encode(buf.getvalue()).decode("ascii")
    except Exception as e:
        print("sandloop: could not render figure: %r" % (e,), file=sys.stderr)
        return None


def _flush_figures(close=True):
    """Emit every open pyplot figure not shown yet in this cell, then close them."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        from matplotlib._pylab_helpers import Gcf

        managers = Gcf.get_all_fig_managers()
    except Exception:
        return
    for manager in managers:
        fig = manager.canvas.figure
        if id(fig) in S.shown:
            continue
        S.shown.add(id(fig))
        png = _figure_png(fig)
        if png is not None:
            _send(_result_event({"image/png": png, "text/plain": repr(fig)}, False))
    if close and managers:
        try:
            plt.close("all")
        except Exception:
            pass


class _BackendFinder:
    """Imports sandloop_backend (MPLBACKEND=module://sandloop_backend): Agg whose show() emits PNGs."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "sandloop_backend":
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, cls)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(mod):
        from matplotlib.backend_bases import FigureManagerBase
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        def show(*args, **kwargs):
            _flush_figures(close=True)

        mod.FigureCanvas = FigureCanvasAgg
        mod.FigureManager = FigureManagerBase
        mod.show = show


# ---------------------------------------------------------------- shell


def _shell(cmd):
    """Run a `!cmd` line: output streams through fds 1 and 2; a non-zero exit raises."""
    import subprocess

    rc = _run_shell(cmd)
    if rc != 0:
        raise subprocess.CalledProcessError(rc, cmd)


def _system(cmd):
    """os.system that a KeyboardInterrupt can stop (C system() blocks SIGINT)."""
    rc = _run_shell(cmd)
    # os.system returns a wait status.
    return rc << 8 if rc >= 0 else -rc


def _run_shell(cmd):
    import subprocess

    _flush_stdio()
    p = subprocess.Popen(cmd, shell=True, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        return p.wait()
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        raise


def _input(prompt=""):
    raise StdinNotImplementedError(
        "input() is not supported: the sandbox has no stdin. "
        "Put the data in the code, in a variable or in a file instead."
    )


def _transform_shell(code):
    """Turn `!cmd` lines into calls, keeping line numbers."""
    lines = code.splitlines(True)
    changed = False
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith("!"):
            indent = line[: len(line) - len(stripped)]
            cmd = stripped[1:].rstrip("\r\n")
            nl = "\n" if line.endswith("\n") else ""
            lines[i] = "%s__sandloop_shell__(%r)%s" % (indent, cmd, nl)
            changed = True
    return "".join(lines) if changed else None


# ---------------------------------------------------------------- execution


def _parse(code, filename):
    try:
        return ast.parse(code, filename, "exec")
    except SyntaxError:
        alt = _transform_shell(code)
        if alt is None:
            raise
        return ast.parse(alt, filename, "exec")


def _compile(code, filename):
    """Compile a cell into (statements, final expression or None).

    Compiled cells are cached by source (agents resend the same code), with
    the code objects renamed to this cell's filename for tracebacks.
    """
    hit = _compiled.get(code)
    if hit is not None:
        return tuple(_rename(c, filename) if c is not None else None for c in hit)
    tree = _parse(code, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
    body = compile(tree, filename, "exec") if tree.body else None
    expr = compile(ast.Expression(last.value), filename, "eval") if last is not None else None
    if len(code) <= 4096:
        if len(_compiled) >= 256:
            _compiled.clear()
        _compiled[code] = (body, expr)
    return body, expr


_compiled = {}


def _rename(c, filename):
    if c.co_filename == filename:
        return c
    consts = c.co_consts
    if any(type(k) is types.CodeType for k in consts):
        consts = tuple(_rename(k, filename) if type(k) is types.CodeType else k for k in consts)
    return c.replace(co_filename=filename, co_consts=consts)


def _user_frames(tb):
    """Drop the kernel's own frames, keeping the user's and the libraries' ones."""
    frames = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != KERNEL_FILE:
            frames.append(tb)
        tb = tb.tb_next
    return frames


def _error_event(e, parse=False):
    etype = type(e)
    if parse:
        # The parse happened in kernel code: show only the error and its place.
        tb_text = "".join(traceback.format_exception_only(etype, e))
    else:
        frames = _user_frames(e.__traceback__)
        # Relink the kept frames; tb_next is writable since Python 3.7.
        head = None
        for tb in reversed(frames):
            tb.tb_next = head
            head = tb
        e = e.with_traceback(head)
        tb_text = "".join(traceback.format_exception(etype, e, head))
    name = etype.__qualname__
    if etype.__module__ not in ("builtins", "__main__"):
        name = etype.__module__ + "." + name
    try:
        value = str(e)
    except Exception:
        value = "<unprintable %s>" % etype.__name__
    return {"type": "error", "name": name, "value": value, "traceback": tb_text}


_getrusage = resource.getrusage
_SELF = resource.RUSAGE_SELF
_CHILDREN = resource.RUSAGE_CHILDREN


def _peak_reset():
    # Resets the peak RSS that getrusage reports as ru_maxrss (Linux >= 4.0),
    # so the peak is this execution's.
    if S.clear_refs_fd >= 0:
        try:
            os.write(S.clear_refs_fd, b"5")
            return
        except OSError:
            pass


def _run_user(ns, body, expr, quiet, events):
    """Run the compiled cell; the main result is appended to events, not sent yet."""
    S.in_user = True
    try:
        if body is not None:
            exec(body, ns)
        if expr is not None:
            value = eval(expr, ns)
            if value is not None and not quiet:
                ns["_"] = value
                data = _mime_bundle(value)
                if data:
                    events.append(_result_event(data, True))
        if "matplotlib.pyplot" in sys.modules:
            if events:
                _send(*events)
                events.clear()
            _flush_figures(close=True)
    finally:
        S.in_user = False


def _on_sigint(signum, frame):
    if S.in_user:
        if S.sending:
            S.deferred = True
        else:
            raise KeyboardInterrupt


def run_cell(ns, req):
    S.count += 1
    count = S.count
    code = req.get("code", "")
    env = req.get("env") or None
    S.shown = set()
    t0 = time.perf_counter()
    self0 = _getrusage(_SELF)
    _peak_reset()
    saved = None
    if env:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
    status = "ok"
    events = []
    filename = "<cell %d>" % count
    try:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            body, expr = _compile(code, filename)
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as e:
            status = "error"
            events.append(_error_event(e, parse=True))
        else:
            quiet = expr is not None and code.rstrip().endswith(";")
            _run_user(ns, body, expr, quiet, events)
    except KeyboardInterrupt as e:
        S.in_user = False
        status = "interrupted"
        events.append(_error_event(e))
    except SystemExit as e:
        S.in_user = False
        if e.code not in (None, 0):
            status = "error"
            events.append(_error_event(e))
    except BaseException as e:
        S.in_user = False
        status = "error"
        events.append(_error_event(e))
    finally:
        S.in_user = False
        if saved:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    self1 = _getrusage(_SELF)
    cpu = self1.ru_utime - self0.ru_utime + self1.ru_stime - self0.ru_stime
    # Children count once waited for; one call per cell keeps this cheap.
    child = _getrusage(_CHILDREN)
    child_cpu = child.ru_utime + child.ru_stime
    cpu += child_cpu - S.child_cpu
    S.child_cpu = child_cpu
    child_peak = child.ru_maxrss * 1024
    grew = child_peak > S.child_peak
    S.child_peak = child_peak
    # Formatted by hand: this is on every execution's path.
    events.append(
        '{"type":"end","status":"%s","execution_count":%d,"duration_ms":%.3f,"cpu_ms":%.3f,"memory_peak_bytes":%d}'
        % (
            status,
            count,
            (time.perf_counter() - t0) * 1000,
            cpu * 1000,
            max(self1.ru_maxrss * 1024, child_peak if grew else 0),
        )
    )
    _send(*events, mark=False)


def is_complete(code):
    """Say whether code typed at a prompt is complete: "complete", "incomplete" or "invalid"."""
    import codeop
    import warnings

    if not code.strip():
        return "complete"
    if code.endswith("\n\n"):
        return "complete"  # a blank line ends a block, as at Python's own prompt
    lines = code.rstrip("\n").split("\n")
    if all(l.lstrip().startswith("!") for l in lines if l.strip()):
        return "complete"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = codeop.compile_command(code, "<input>", "exec")
    except (SyntaxError, OverflowError, ValueError):
        if _transform_shell(code) is not None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    compiled = codeop.compile_command(_transform_shell(code), "<input>", "exec")
            except (SyntaxError, OverflowError, ValueError):
                return "invalid"
        else:
            return "invalid"
    if compiled is None:
        return "incomplete"
    last = lines[-1]
    if len(lines) > 1 and last[:1] in (" ", "\t") or last.rstrip().endswith(":"):
        return "incomplete"
    return "complete"


# ---------------------------------------------------------------- requests


class _Reader:
    """Reads request lines from a descriptor. What it has read past the
    current line (buf) is explicit, so a restore can hand it on to the
    kernel that takes over (see _restore)."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = bytearray()
        self.scan = 0  # buf[:scan] has no newline
        self.big = False  # the last line was long: so may the next (an import's)

    def readline(self):
        buf = self.buf
        while True:
            i = buf.find(b"\n", self.scan)
            if i >= 0:
                line = bytes(buf[: i + 1])
                del buf[: i + 1]
                self.scan = 0
                self.big = i >= 1 << 16
                return line
            self.scan = len(buf)
            chunk = os.read(self.fd, 1 << 20 if self.big or len(buf) >= 1 << 16 else 1 << 16)
            if not chunk:
                line = bytes(buf)
                buf.clear()
                self.scan = 0
                return line
            buf += chunk


# ---------------------------------------------------------------- checkpoints
#
# A checkpoint is a dormant fork of this process (see the Go package's doc).
# It waits on its own socket (a socketpair: one end in the checkpoint, the
# other in the live kernel) and never reads the request pipe. Messages to it:
#   {"op": "wake", ...} + descriptors: become the live kernel. The message
#       carries the live kernel's checkpoint table, with the live kernel's
#       ends of every checkpoint's socket, so the woken one can restore any
#       of them, including checkpoints taken after itself.
#   {"op": "export"} + a pipe: write the checkpoint's variables to it.
#   {"op": "drop"}: exit.
# A checkpoint whose process died (the OOM killer may pick it: it is in the
# session's cgroup) shows as a hang-up on the live kernel's end: it is gone.

MAX_CHECKPOINTS = 200  # each wake message carries one descriptor per checkpoint (SCM_MAX_FD is 253)
PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class _Checkpoint:
    __slots__ = ("id", "pid", "sock", "count", "threads", "processes")

    def info(self, typ):
        return {"type": typ, "id": self.id, "pid": self.pid, "execution_count": self.count,
                "threads": self.threads, "processes": self.processes}


class _CP:
    table = {}  # id -> _Checkpoint, oldest first
    next_id = 1
    ctl_r = -1  # the anchor's control pipe: live kernels write their pid to ctl_w
    ctl_w = -1
    reap = []  # dropped checkpoints that may be our children
    former = set()  # old live kernels, perhaps still exiting: not the user's processes
    lost = {}  # id -> why its copy could not be made (a fork after the reply failed)


def _ensure_ctl():
    if _CP.ctl_w < 0:
        _CP.ctl_r, _CP.ctl_w = os.pipe()  # both close on exec


def _threads_now():
    main = threading.main_thread()
    return ["%s (%s)" % (t.name, "daemon" if t.daemon else "thread") for t in threading.enumerate() if t is not main]


def _processes_now():
    """The processes of the session other than the kernel's own (the init,
    the anchor, the live kernel, the checkpoints), as "PID COMMAND": child
    processes and background servers, which a checkpoint does not carry.

    Inside a jail (the kernel started by PID 1 of its PID namespace) that
    is every process; on a host, the kernel's descendants."""
    ours = {1, os.getpid(), S.first_pid}
    ours.update(c.pid for c in _CP.table.values())
    ours.update(_CP.reap)
    _CP.former = {p for p in _CP.former if os.path.exists("/proc/%d" % p)}
    ours.update(_CP.former)
    parent = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        if S.jailed and int(name) in ours:
            continue  # in a jail ours are left out whatever their parent: no need to read their stat
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                raw = f.read()
            fields = raw[raw.rindex(b")") + 2 :].split()
            if fields[0] == b"Z":
                continue  # ended, not yet reaped
            parent[int(name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    if S.jailed:
        pids = [p for p in parent if p not in ours]
    else:
        pids = []
        for p in parent:
            q, seen = p, 0
            while q in parent and q != S.first_pid and seen < 64:
                q, seen = parent[q], seen + 1
            if q == S.first_pid and p not in ours:
                pids.append(p)
    out = []
    for p in sorted(pids):
        try:
            with open("/proc/%d/cmdline" % p, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").strip().decode("utf-8", "replace")
            if not cmd:
                with open("/proc/%d/comm" % p, "rb") as f:
                    cmd = "[%s]" % f.read().strip().decode("utf-8", "replace")
        except OSError:
            continue  # it ended meanwhile
        if len(cmd) > 120:
            cmd = cmd[:117] + "..."
        out.append("%d %s" % (p, cmd))
    return out


def _fork_keeping_state():
    """os.fork, keeping in the child what fork changes: the random module
    reseeds itself in a forked child (an at-fork hook), and locks held by
    other threads at the fork stay held in the child forever."""
    rnd = sys.modules.get("random")
    state = rnd.getstate() if rnd is not None else None
    _flush_stdio()  # else the output buffered now would come out twice
    pid = os.fork()
    if pid == 0:
        if state is not None:
            rnd.setstate(state)
        S.lock = threading.Lock()
    return pid


def _gone(cp):
    """Whether the checkpoint's process has died (its end of the socket is closed)."""
    import select

    p = select.poll()
    p.register(cp.sock, select.POLLIN)
    for _, ev in p.poll(0):
        if ev & (select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)):
            return True
    return False


def _rebase_children():
    """After the kernel itself waited for a process (a dropped checkpoint,
    an export): what that child used is not the next cell's."""
    child = _getrusage(_CHILDREN)
    S.child_cpu = child.ru_utime + child.ru_stime
    S.child_peak = child.ru_maxrss * 1024


def _reap_dropped():
    left = []
    for pid in _CP.reap:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                left.append(pid)
        except ChildProcessError:
            pass  # not our child: its parent (or the anchor) reaps it
    _CP.reap = left
    _rebase_children()


def checkpoint(ns):
    """Takes a checkpoint: forks a dormant copy of this process. In the copy
    this returns when the checkpoint is restored, as the live kernel.

    Without other threads the reply goes first and the fork right after,
    before the next request is read: nothing can change this process in
    between (no other thread, no cell), so the copy is of the moment of the
    reply, and the host's next request waits for the fork instead of the
    checkpoint's caller. A fork that fails then leaves the checkpoint gone
    (its socket reads as closed, as for a copy the OOM killer took), with
    the reason kept for the restore that finds it so."""
    _reap_dropped()
    if len(_CP.table) >= MAX_CHECKPOINTS:
        _reply({"type": "checkpoint", "reason": "too many checkpoints (at most %d): drop some first" % MAX_CHECKPOINTS})
        return
    threads, procs = _threads_now(), _processes_now()
    _ensure_ctl()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    cp = _Checkpoint()
    cp.id, cp.pid, cp.sock, cp.count, cp.threads, cp.processes = _CP.next_id, 0, ours, S.count, threads, procs
    early = not threads and threading.active_count() == 1
    if early:
        _reply(cp.info("checkpoint"))
    with S.lock:  # no thread is in the middle of an event while we fork
        try:
            pid = _fork_keeping_state()
        except OSError as e:
            pid = -1
            err = e
        if pid == 0:
            ours.close()
            if threads:
                _fresh_streams()
            _dormant(ns, theirs, cp.id)  # returns when restored
            return
    theirs.close()
    if pid < 0:
        why = "cannot fork the kernel: %s" % (err.strerror or err)
        if not early:
            ours.close()
            _reply({"type": "checkpoint", "reason": why})
            return
        # Already announced: kept, gone, until restored or dropped.
        ours.close()
        cp.sock, peer = socket.socketpair()
        peer.close()
        _CP.lost[cp.id] = why
    cp.pid = max(pid, 0)
    _CP.next_id += 1
    _CP.table[cp.id] = cp
    if not early:
        _reply(cp.info("checkpoint"))


def _fresh_streams():
    """New stdout and stderr objects in a forked child: another thread may
    have held the old ones' locks at the fork (left alone if user code
    replaced them)."""
    if sys.stdout is sys.__stdout__:
        sys.stdout = sys.__stdout__ = _text_stream(1)
    if sys.stderr is sys.__stderr__:
        sys.stderr = sys.__stderr__ = _text_stream(2)


def _name_self(name):
    """Sets this process's name (its comm, at most 15 bytes). A dormant
    copy is named "sl-cpN" (N its checkpoint's id): the host finds the
    copies by name to measure their memory without asking the live kernel
    (a process can rename only itself)."""
    try:
        with open("/proc/self/comm", "wb", buffering=0) as f:
            f.write(name)
    except OSError:
        pass


def _dormant(ns, sock, cid):
    """The checkpoint's life: wait on sock; return as the live kernel when woken."""
    try:
        with open("/proc/self/comm", "rb") as f:
            live_name = f.read().strip() or b"python3"
    except OSError:
        live_name = b"python3"
    _name_self(b"sl-cp%d" % cid)
    gc_was = gc.isenabled()
    gc.disable()  # a collection would write to (and so copy) every page it walks
    flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
    exporting = []  # copies streaming a raw export
    while True:
        for pid in list(exporting):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] != 0:
                    exporting.remove(pid)
            except ChildProcessError:
                exporting.remove(pid)
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, MAX_CHECKPOINTS + 8, flags)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)  # nobody can wake it any more
        try:
            req = json.loads(msg)
        except ValueError:
            req = {}
        op = req.get("op")
        if op == "wake":
            # The anchor learns the new live kernel first, then the old one
            # may go.
            _name_self(live_name)
            pid = os.getpid()
            if _CP.ctl_w >= 0:
                try:
                    _write_all(_CP.ctl_w, b"%d\n" % pid)
                except OSError:
                    pass  # user code closed it: signals then reach the old live kernel's pid
            sock.send(_encode({"ok": True, "pid": pid}).encode())
            _wake(req, fds)
            if req.get("drop"):
                # Used up by this restore (an undo): no fresh copy is
                # made, the checkpoint is forgotten.
                me = _CP.table.pop(int(req["id"]), None)
                if me is not None:
                    me.sock.close()
                sock.close()
                _CP.reap.extend(exporting)
                if gc_was:
                    gc.enable()
                return
            # The reply is sent: now the fresh dormant copy that keeps the
            # checkpoint restorable (off the restore's path: the next
            # request is read after it). Nothing of the user's has run
            # since the wake; what _wake changed the copy undoes, or its own
            # wake sets again.
            try:
                child = _fork_keeping_state()
            except OSError:
                child = -1
            if child == 0:
                for cp in _CP.table.values():
                    cp.sock.close()  # the live kernel's ends: its own come with its wake
                _CP.table = {}
                _name_self(b"sl-cp%d" % int(req["id"]))
                continue  # the fresh dormant copy
            sock.close()
            me = _CP.table.get(int(req["id"]))
            if me is not None:
                if child > 0:
                    me.pid = child
                else:
                    # No copy (out of memory): the checkpoint is used up.
                    # Its socket reads as closed: gone, until dropped.
                    me.sock.close()
                    me.sock, peer = socket.socketpair()
                    peer.close()
            _CP.reap.extend(exporting)
            if gc_was:
                gc.enable()
            return
        if op == "export" and len(fds) == 1:
            S.tag = req.get("tag") or 0
            raw = bool(req.get("raw"))
            try:
                child = os.fork()
            except OSError as e:
                child = -1
                err = e
            if child == 0:
                try:
                    _name_self(live_name)  # not a checkpoint's copy
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    _export_child(ns, _RawOut(fds[0]) if raw else _StateOut(fds[0]))
                finally:
                    os._exit(0)
            os.close(fds[0])
            if raw:
                # The copy streams on its own; reaped at a later message.
                if child > 0:
                    exporting.append(child)
                    sock.send(_encode({"ok": True, "pid": child}).encode())
                else:
                    sock.send(_encode({"ok": False, "reason": err.strerror or str(err)}).encode())
                continue
            status = 0
            if child > 0:
                status = os.waitpid(child, 0)[1]
            sock.send(_encode({"ok": child > 0, "status": status}).encode())
            continue
        for fd in fds:
            os.close(fd)
        if op == "drop":
            os._exit(0)


def _wake(req, fds):
    """This checkpoint becomes the live kernel, and answers the restore."""
    old = _CP.table
    table = {}
    for entry, fd in zip(req.get("table") or (), fds):
        cp = _Checkpoint()
        cp.id, cp.pid, cp.count = int(entry["id"]), int(entry["pid"]), int(entry["execution_count"])
        cp.threads, cp.processes = entry.get("threads") or [], entry.get("processes") or []
        cp.sock = socket.socket(fileno=fd)
        table[cp.id] = cp
    for fd in fds[len(table) :]:
        os.close(fd)
    for cp in old.values():
        cp.sock.close()  # the ends inherited at the fork; the live kernel's came with the message
    me = int(req["id"])
    _CP.table = table
    _CP.next_id = max(_CP.next_id, int(req.get("next_id") or 0))
    _CP.reap = []
    _CP.former = set(req.get("former") or ())
    _CP.lost = {int(k): v for k, v in (req.get("lost") or {}).items()}
    pid = os.getpid()
    S.tag = req.get("tag") or 0
    # What belongs to the process, not to its memory: its own peak reset
    # and its own children's usage.
    if S.clear_refs_fd >= 0:
        os.close(S.clear_refs_fd)
        try:
            S.clear_refs_fd = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            S.clear_refs_fd = -1
    _rebase_children()
    S.req.buf = bytearray(base64.b64decode(req.get("pending") or ""))
    S.req.scan = 0
    cp = table.get(me)
    ev = cp.info("restore") if cp is not None else {"type": "restore", "id": me, "execution_count": S.count}
    ev["execution_count"] = S.count
    ev["pid"] = pid
    _reply(ev)


def restore(req):
    """Hands the session over to checkpoint req["id"]; on success this
    process never returns (it exits, or becomes the anchor)."""
    cid = int(req.get("id") or 0)
    cp = _CP.table.get(cid)
    if cp is None:
        _reply({"type": "restore", "id": cid, "reason": "no checkpoint %d" % cid})
        return
    if _gone(cp):
        _reply({"type": "restore", "id": cid, "gone": True, "why": _CP.lost.get(cid, "")})  # kept until dropped
        return
    _ensure_ctl()
    first = os.getpid() == S.first_pid
    if first:
        # Orphans (the old live kernels' checkpoints, the new live kernel
        # once its parent exits) must come to the anchor, whose exit ends
        # the session: it waits for the live kernel. Kept across exec.
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    order = list(_CP.table.values())
    msg = {"op": "wake", "id": cid, "drop": bool(req.get("drop")), "tag": S.tag, "next_id": _CP.next_id, "former": sorted(_CP.former | {os.getpid()}), "lost": {str(k): v for k, v in _CP.lost.items()}, "pending": base64.b64encode(bytes(S.req.buf)).decode("ascii"),
           "table": [{"id": c.id, "pid": c.pid, "execution_count": c.count, "threads": c.threads, "processes": c.processes} for c in order]}
    S.lock.acquire()  # kept to the end on success: our threads send no more events
    try:
        _flush_stdio()
        # From the wake on, the woken kernel answers the host: nothing our
        # threads still write (until we exit) may reach it.
        saved = _let_go()
        try:
            socket.send_fds(cp.sock, [_encode(msg).encode()], [c.sock.fileno() for c in order])
            cp.sock.settimeout(30)  # within the host's bound on the request (60 s)
            ack = cp.sock.recv(1 << 16)
            cp.sock.settimeout(None)
        except socket.timeout:
            # Stuck: it must never wake later beside us.
            try:
                os.kill(cp.pid, signal.SIGKILL)
            except OSError:
                pass
            ack = b""
        except OSError:
            ack = b""
        ok = False
        if ack:
            ack = json.loads(ack)
            ok = ack.get("ok")
        if not ok:
            _take_back(saved)
            S.lock.release()
            if not ack:
                _reply({"type": "restore", "id": cid, "gone": True})
            else:
                _reply({"type": "restore", "id": cid, "reason": ack.get("reason") or "the checkpoint refused"})
            return
    except BaseException:
        if S.lock.locked():
            S.lock.release()
        raise
    # The checkpoint is the live kernel now.
    if first:
        _become_anchor(int(ack["pid"]))
    os._exit(0)


def _let_go():
    """Points this process's pipes to the host at /dev/null (not closed, so
    that a thread's write cannot reach a reused descriptor); returns what
    _take_back needs to undo it."""
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    saved = []
    for fd in (1, 2, S.ev_fd, S.out_fd, S.err_fd):
        try:
            saved.append((fd, fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100), fd > 2))
            os.dup2(null, fd, inheritable=fd <= 2)
        except OSError:
            pass
    os.close(null)
    return saved


def _take_back(saved):
    for fd, copy, cloexec in saved:
        os.dup2(copy, fd, inheritable=not cloexec)
        os.close(copy)


def _forget(cp):
    _CP.table.pop(cp.id, None)
    _CP.lost.pop(cp.id, None)
    cp.sock.close()
    if cp.pid > 0:
        _CP.reap.append(cp.pid)


def drop_checkpoint(req):
    cid = int(req.get("id") or 0)
    cp = _CP.table.get(cid)
    if cp is None:
        _reply({"type": "drop_checkpoint", "id": cid, "reason": "no checkpoint %d" % cid})
        return
    try:
        cp.sock.send(b'{"op":"drop"}')
    except OSError:
        pass  # gone already
    _forget(cp)
    # It exits at once (freeing its pages takes a moment): reap it if it
    # is our child, else the next requests will.
    deadline = time.monotonic() + 0.05
    while True:
        _reap_dropped()
        if cp.pid not in _CP.reap or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    _reply({"type": "drop_checkpoint", "id": cid})


def checkpoint_memory():
    """Private memory of each checkpoint's process (gone ones left out)."""
    mem = {}
    for cp in list(_CP.table.values()):
        if _gone(cp):
            continue
        total = 0
        try:
            with open("/proc/%d/smaps_rollup" % cp.pid, "rb") as f:
                for line in f:
                    if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                        total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
        mem[str(cp.id)] = total
    _reply({"type": "checkpoint_memory", "memory": mem})


# The anchor: what the process the host signals (the kernel's first
# process) becomes when it stops being the live kernel. Its exit ends the
# session, so it lives as long as the live kernel: it forwards the host's
# signals to the live kernel (whose pid each new live kernel writes to the
# control pipe), reaps orphans (it is a child subreaper) and exits as the
# live kernel did (a signal death as the same signal).
_ANCHOR = r"""
import os, signal, sys, time
ctl, live = int(sys.argv[1]), int(sys.argv[2])
os.closerange(3, ctl)
os.closerange(ctl + 1, 1 << 20)
os.set_blocking(ctl, False)
pend = b""
def update():
    global live, pend
    while True:
        try:
            b = os.read(ctl, 4096)
        except BlockingIOError:
            break
        if not b:
            break
        pend += b
    *lines, pend = pend.split(b"\n")
    for l in lines:
        if l:
            live = int(l)
def forward(sig, frame):
    update()
    try:
        os.kill(live, sig)
    except OSError:
        pass
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
for s in FORWARDED:
    signal.signal(s, forward)
signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
while True:
    try:
        pid, st = os.waitpid(-1, 0)
    except ChildProcessError:
        update()
        try:
            os.kill(live, 0)
        except ProcessLookupError:
            os._exit(1)
        time.sleep(0.05)
        continue
    update()
    if pid != live:
        continue
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        try:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(st) if os.WIFEXITED(st) else 1)
"""


def _become_anchor(live):
    # Signals wait (blocked, kept pending across exec) until the anchor's
    # handlers are in place; until then SIGINT would end the session.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    os.set_inheritable(_CP.ctl_r, True)
    exe = sys.executable or "/usr/bin/python3"
    args = [exe, "-I", "-S", "-c", _ANCHOR, str(_CP.ctl_r), str(live)]
    try:
        os.execv(exe, args)
    except OSError:
        pass
    # exec failed: be the anchor in this process (it keeps the old kernel's memory).
    sys.argv = args[4:]
    sys.argv[0] = "-c"
    exec(compile(_ANCHOR, "<anchor>", "exec"), {"__name__": "__anchor__"})
    os._exit(1)


# ---------------------------------------------------------------- state
#
# The user's variables as a byte stream of records, each a kind byte, a
# big-endian 8-byte length and the payload:
#   H  header, JSON {"version": 2, "serializer": "dill" | "pickle"}
#   M  a module, JSON {"name": ..., "module": ...}: imported again by name
#   V  a variable starts, pickled by the C pickler: its name (UTF-8)
#   W  a variable starts, pickled by dill: its name
#   D  a piece of its pickle (as the pickler writes it)
#   B  one of its out-of-band buffers (protocol 5's PickleBuffer: a numpy
#      array's or a pandas block's memory), raw, in order
#   F  the variable is complete: load it
#   X  the variable failed: forget its pieces
#   P  padding before a B record (its payload starts at a multiple of BUF_ALIGN)
#   R  a buffer already in an earlier state file: big-endian 8-byte serial
#      of that file (the host's), offset and length of the bytes in it;
#      written instead of a B record when the bytes are equal (see _Reuse)
#   E  the end, JSON: the manifest (variables, not_saved, execution_count)
# Each variable is serialized on its own: one that fails does not stop the
# others. The C pickler (protocol 5, large buffers out of band: written
# from the object's own memory, no copy) goes first; dill, where installed,
# takes what it refuses (lambdas, functions and classes defined in cells,
# and what refers to them). Values stream out as the pickler makes them.
# Two names for one object come back as two copies.
#
# The stream goes on the state channel where the host gave one (fd 7, a
# unix socket): the kernel makes a pipe per stream and passes one end over
# the socket, and the bytes go raw through the pipe, beside the event pipe,
# so the live kernel answers as soon as it has forked the copy that
# writes them. Without the channel, they go as base64 in state_data events.

CHUNK = 3 << 18  # raw bytes per state_data event (768 KiB)
RAW_SMALL = 256 << 10  # raw records are gathered up to this, larger parts written directly
BUF_ALIGN = 64  # where buffers start in a stream (a cache line; numpy wants at most 16)
F_SETPIPE_SZ = 1031
STATE_PIPE = 1 << 20
MAX_STATE_FILES = 16  # a stream's file and the earlier files it refers to, passed at once


def _serializers():
    """pickle, and dill (None where not installed) for what pickle refuses."""
    import pickle

    try:
        import dill

        if hasattr(dill, "_dill") and hasattr(dill._dill, "_main_module"):
            dill._dill._main_module = sys.modules["__main__"]
    except Exception:
        dill = None
    return pickle, dill


def _has_dill():
    """Whether dill is installed, without importing it (tens of
    milliseconds: done only for a value that needs it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("dill") is not None
    except (ImportError, ValueError):
        return False


class _LazyDill:
    """dill, imported at its first use."""

    def __getattr__(self, name):
        _, dill = _serializers()
        if dill is None:
            raise ImportError("dill is not importable")
        return getattr(dill, name)


def _serializer():
    pickle, dill = _serializers()
    return ("dill", dill) if dill is not None else ("pickle", pickle)


def _reason(e):
    text = str(e) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _nbytes(p):
    return p.nbytes if isinstance(p, memoryview) else len(p)


class _StateOut:
    """Writes records as state_data event lines to fd."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = bytearray()
        self.pos = 0  # bytes of records so far
        # Lines stay well below the host's bound on one event.
        self.chunk = max(3 << 10, min(CHUNK, (S.max_event - 1024) // 4 * 3))

    def record(self, kind, *parts):
        size = sum(_nbytes(p) for p in parts)
        self.pos += 9 + size
        self.buf += kind + struct.pack(">Q", size)
        for p in parts:
            if len(self.buf) + _nbytes(p) < self.chunk:
                self.buf += p
                continue
            view = memoryview(p)
            while view:
                room = self.chunk - len(self.buf)
                self.buf += view[:room]
                view = view[room:]
                if len(self.buf) >= self.chunk:
                    self.flush()
        if len(self.buf) >= self.chunk:
            self.flush()

    def flush(self):
        if self.buf:
            # The host reads these lines without a JSON decoder: keep the
            # exact form (Go's stateDataPrefix).
            parts = [b'{"type":"state_data","tag":%d,"chunk":"' % S.tag, base64.b64encode(self.buf), b'"}\n']
            n = os.writev(self.fd, parts)
            if n < sum(len(p) for p in parts):
                _write_all(self.fd, b"".join(parts)[n:])
            self.buf = bytearray()

    def end(self, manifest):
        self.flush()
        _write_all(self.fd, _encode({"type": "state_end", "tag": S.tag, "manifest": manifest}).encode() + b"\n")


class _RawOut:
    """Writes records as raw bytes to fd (a pipe of the state channel):
    small ones gathered, large parts (a buffer) straight from their memory."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = bytearray()
        self.pos = 0  # bytes of records so far

    def record(self, kind, *parts):
        size = sum(_nbytes(p) for p in parts)
        self.pos += 9 + size
        self.buf += kind + struct.pack(">Q", size)
        for p in parts:
            if len(self.buf) + _nbytes(p) <= RAW_SMALL:
                self.buf += p
            else:
                self.flush()
                _write_all(self.fd, p)
        if len(self.buf) >= RAW_SMALL:
            self.flush()

    def flush(self):
        if self.buf:
            _write_all(self.fd, self.buf)
            self.buf = bytearray()

    def end(self, manifest):
        self.flush()


class _Pieces:
    """The file a pickler writes to: each write becomes a D record."""

    def __init__(self, out):
        self.out = out

    def write(self, b):
        # bytes, or a buffer (a PickleBuffer of a large array): as bytes
        view = memoryview(b)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self.out.record(b"D", view)
        return view.nbytes


class _InCell(Exception):
    pass


def _c_pickler(pickle):
    class P(pickle.Pickler):
        """The C pickler, refusing what only dill carries right: functions
        and classes defined in cells (pickle would save them by a name
        that a new kernel does not have yet)."""

        def reducer_override(self, obj):
            if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
                raise _InCell("%s defined in a cell" % getattr(obj, "__qualname__", "an object"))
            return NotImplemented

    return P


class _Reuse:
    """The buffers of earlier state files (the host's, passed with the
    export request: the last export's file first, then the files it refers
    to), by variable and position, so that a buffer whose bytes are equal
    to the one at the same place last time is written as an R record
    referring to those bytes instead of a copy of them.

    Equality is proven one of two ways, neither depending on when or by
    whom the buffer was written (a restore, another process):
    - by its pages (unwritten): the buffer lies in a mapping of that very
      state file (a kernel that imported it loaded its arrays over it), at
      the offset of those bytes, and /proc/self/pagemap says each of its
      pages is either the file's own page or not yet faulted in (which
      reads the file). The file is sealed: its pages cannot change. A page
      written since is an anonymous copy (present, not a file page) or
      swapped out: then the bytes are compared. Costs a read of 8 bytes a
      page, not of the buffer: a child forked again compares nothing it
      has not written.
    - by its bytes (memcmp) otherwise: a read of both (the file's range
      populated first in one call, MADV_POPULATE_READ, rather than a fault
      per few pages), and no new page."""

    def __init__(self, bases, by_bytes=False):
        import ctypes
        import mmap

        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None)
        self.libc.memcmp.restype = ctypes.c_int
        self.libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.by_bytes = by_bytes
        self.compared = 0  # bytes found equal by comparing them
        self.mapped = 0  # bytes found equal by their pages
        self.maps = {}  # serial -> (address, size)
        self.files = {}  # serial -> (device major, minor, inode) of the file
        self.vmas = None  # this process's mappings, sorted (_vma)
        self.pagemap = None  # /proc/self/pagemap, opened at the first look (-1: cannot)
        self.keep = []
        for serial, fd in bases:
            st = os.fstat(fd)
            if st.st_size == 0:
                continue
            # Shared and read-only (the file is sealed); populated where a
            # comparison needs it (find), not here: a buffer proven equal
            # by its pages is never read.
            m = mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            pb = _PyBuffer()
            if _get_buffer(ctypes, m, pb, 0) != 0:
                raise OSError("cannot address a state file")
            self.keep.append(pb)  # released with the process: it exits after the export
            self.maps[serial] = (pb.buf, st.st_size, m)
            self.files[serial] = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        self.index = {}  # (name, i) -> (serial, offset, length)
        if bases and bases[0][0] in self.maps:
            self._scan(bases[0][0])

    def _scan(self, serial):
        """Indexes the buffers of the stream in file serial."""
        _, size, m = self.maps[serial]
        off, name, i = 0, None, 0
        while off + 9 <= size:
            kind = m[off]
            n = struct.unpack_from(">Q", m, off + 1)[0]
            start = off + 9
            if start + n > size:
                break
            if kind in (ord("V"), ord("W")):
                name, i = bytes(m[start : start + n]), 0
            elif kind == ord("B") and name is not None:
                self.index[(name, i)] = (serial, start, n)
                i += 1
            elif kind == ord("R") and name is not None and n == 24:
                self.index[(name, i)] = struct.unpack_from(">QQQ", m, start)
                i += 1
            elif kind == ord("E"):
                break
            off = start + n

    def find(self, name, i, raw):
        """(serial, offset) of bytes equal to raw's at (name, i), or None."""
        at = self.index.get((name, i))
        if at is None or at[2] != raw.nbytes or raw.nbytes == 0:
            return None
        base = self.maps.get(at[0])
        if base is None or at[1] + at[2] > base[1]:
            return None
        pb = _PyBuffer()
        if _get_buffer(self.ctypes, raw, pb, 0x1C) != 0:  # PyBUF_STRIDES|PyBUF_FORMAT: raw() is one contiguous run
            return None
        try:
            addr, n = pb.buf, raw.nbytes
            there = base[0] + at[1]
            # The whole pages inside the buffer by theirs; the partial
            # pages at its ends (a remapped buffer's own, anonymous:
            # remap_export) by their bytes.
            lo, hi = -(-addr // PAGE) * PAGE, (addr + n) // PAGE * PAGE
            if not self.by_bytes and hi - lo >= PAGE and self._unwritten(lo, hi - lo, (at[0], at[1] + lo - addr, hi - lo)):
                if self._same(addr, there, lo - addr) and self._same(hi, there + hi - addr, addr + n - hi):
                    self.mapped += n
                    return (at[0], at[1])
                return None
            same = self._same(addr, there, n)
        finally:
            _release_buffer(self.ctypes, pb)
        if same:
            self.compared += raw.nbytes
            return (at[0], at[1])
        return None

    def _same(self, addr, there, n):
        """Whether the n bytes at addr equal those at there (in a base)."""
        if n <= 0:
            return True
        page = there & ~(PAGE - 1)
        self.libc.madvise(page, there + n - page, MADV_POPULATE_READ)  # where it fails (before 5.14), faults
        return self.libc.memcmp(addr, there, n) == 0

    def _unwritten(self, addr, n, at):
        """Whether the n bytes at addr are, page by page, those of the
        state file at[0] at offset at[1], unwritten (see the class doc)."""
        serial, off, _ = at
        first, last = addr // PAGE, (addr + n - 1) // PAGE
        if self.pagemap is None:
            try:
                self.pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.pagemap = -1
        if self.pagemap < 0:
            return False
        try:
            # The first page alone first: the session's own memory
            # (anonymous) fails here, without a look at the mappings.
            entries = os.pread(self.pagemap, 8, first * 8)
            if len(entries) != 8 or _PAGE_OK[entries[7]] == 0:
                return False
            vma = self._vma(addr)
            if vma is None:
                return False
            start, end, voff, dev, ino = vma
            if addr + n > end or (dev[0], dev[1], ino) != self.files.get(serial) or voff + (addr - start) != off:
                return False
            want = 8 * (last - first + 1)
            entries = os.pread(self.pagemap, want, first * 8)
        except OSError:
            return False
        if len(entries) != want:
            return False
        # The flags are the top byte of each little-endian entry: a page
        # is the file's if it is absent (0: not faulted in, reads the
        # file) or present and a file page (bits 63 and 61), never swapped
        # (bit 62: an anonymous copy, or a marker); an anonymous page
        # (present, bit 61 clear) was written.
        return entries[7::8].translate(_PAGE_OK).find(0) < 0

    def _vma(self, addr):
        """(start, end, offset, (major, minor), inode) of this process's
        mapping holding addr, or None."""
        if self.vmas is None:
            self.vmas = []
            try:
                with open("/proc/self/maps", "rb") as f:
                    for line in f:
                        if b"/memfd:" not in line:
                            continue  # state files are memfds (the host's NewStateFile)
                        parts = line.split(None, 5)
                        if len(parts) < 5:
                            continue
                        lo, _, hi = parts[0].partition(b"-")
                        major, _, minor = parts[3].partition(b":")
                        self.vmas.append((int(lo, 16), int(hi, 16), int(parts[2], 16), (int(major, 16), int(minor, 16)), int(parts[4])))
            except (OSError, ValueError):
                self.vmas = []
        import bisect

        k = bisect.bisect_right(self.vmas, (addr, 1 << 64)) - 1
        if k < 0 or not (self.vmas[k][0] <= addr < self.vmas[k][1]):
            return None
        return self.vmas[k]


PAGE = os.sysconf("SC_PAGE_SIZE")
MADV_POPULATE_READ = 22
REMAP_MIN = 64 << 10  # buffers from this size are laid out for remap_export
REMAP_RUN = 16  # pages: shorter equal runs are left as they are (each mapping is a VMA)


def _mmapped_chunk(addr, n):
    """Whether the n bytes at addr are the whole of a block of glibc's
    malloc that has a mapping of its own (numpy's arrays of more than
    malloc's mmap threshold, 128 KiB to 32 MiB: a pandas block of a large
    DataFrame): free() unmaps it, realloc() moves it with mremap (which
    refuses a block that became several mappings: glibc then allocates,
    copies and frees), and glibc never madvises it. Only those are
    remapped: a block of the heap, once freed, would stay mapped (keeping
    its state file alive) and be trimmed with MADV_DONTNEED (which makes
    a private file page read the file again, not zeros)."""
    import ctypes

    if addr % PAGE != 16:  # the block's 16-byte header starts its first page (64-bit glibc)
        return False
    size = ctypes.c_size_t.from_address(addr - 8).value  # in the same page: mapped
    return bool(size & 2) and (size & ~7) >= n + 16  # IS_MMAPPED, and large enough


def _buffer_address(raw):
    """The address of raw's memory (one contiguous run), 0 if unknown."""
    import ctypes

    pb = _PyBuffer()
    if _get_buffer(ctypes, raw, pb, 0x1C) != 0:
        return 0
    try:
        return pb.buf or 0
    finally:
        _release_buffer(ctypes, pb)


# ---------------------------------------------------------------- remap
#
# After an export of the live kernel, the host gives the sealed state file
# back (op remap_export, between cells) with the manifest's "remap" list:
# where each large buffer lay when the export's copy forked, and where its
# bytes are in the file (the export laid them out at the same place in a
# page). The kernel replaces each run of whole pages inside such a range
# that still equals the file's bytes by a private mapping of the file
# (MAP_PRIVATE|MAP_FIXED), so that the next export proves them unchanged
# by their pages (_Reuse._unwritten) instead of comparing 100 MB: the
# session's anonymous copy is freed and it shares the file's pages (with
# its children) until it writes one, which then becomes its own again.
#
# Never a write lost: the bytes are compared right before the mapping
# replaces them, each run compared and mapped with no other code able to
# run: only when no other Python thread exists (a thread's numpy loop
# runs without the GIL), with every signal blocked (a handler is Python
# code) and the collector off (a finalizer is too). Whatever the range
# holds now (the same array, another object, freed memory of the heap),
# its bytes stay the same: only the kind of memory changes. The export
# lists only buffers that are the whole of one of malloc's mmap'd blocks
# (_mmapped_chunk), and the range must still lie in private writable
# memory that is anonymous (not the brk heap) or an earlier remap's;
# anything else (a shared mapping, a file's) is left alone.


def _remap_vmas():
    """This process's mappings that a remap may replace: (start, end),
    sorted, adjacent ones merged; and those of them that are earlier
    remaps' (start, end)."""
    out, files = [], []
    with open("/proc/self/maps", "rb") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 5 or parts[1] != b"rw-p":
                continue
            path = parts[5].strip() if len(parts) > 5 else b""
            anon = parts[4] == b"0" and path == b""  # not the brk heap: see _mmapped_chunk
            if not anon and not path.startswith(b"/memfd:sandloop-"):
                continue
            lo, _, hi = parts[0].partition(b"-")
            lo, hi = int(lo, 16), int(hi, 16)
            if not anon:
                files.append((lo, hi))
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
    return out, files


def remap_export(req):
    fds, m = _channel_fds(S.tag)
    if fds is None:
        _reply({"type": "remap_export", "reason": "the host passed no state file"})
        return
    for fd in fds[1:]:
        os.close(fd)
    ev = {"type": "remap_export"}
    threads = _threads_now()
    if threads or len(sys._current_frames()) > 1:
        # Their code could write a buffer between its comparison and its
        # mapping (a numpy loop runs without the GIL).
        os.close(fds[0])
        ev.update(remapped=0, skipped="other threads run", threads=threads or ["a thread of no threading.Thread"])
        _reply(ev)
        return
    try:
        done, skipped = _remap(fds[0], req.get("remap") or [])
    except Exception as e:
        done, skipped = 0, "cannot remap: %s" % _reason(e)
    finally:
        os.close(fds[0])
    ev.update(remapped=done, skipped=skipped)
    _reply(ev)


def _remap(fd, items):
    """remap_export's work: returns (bytes remapped, why not all were)."""
    import bisect
    import ctypes
    import mmap

    size = os.fstat(fd).st_size
    libc = ctypes.PyDLL(None, use_errno=True)  # calls keep the GIL
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.memcmp.restype = ctypes.c_int
    libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    failed = ctypes.c_void_p(-1).value
    base = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if base is None or base == failed:
        return 0, "cannot map the state file"
    done, skipped = 0, []
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    collecting = gc.isenabled()
    gc.disable()
    try:
        for item in items:
            addr, off, n = (int(x) for x in item)
            lo, hi = -(-addr // PAGE) * PAGE, (addr + n) // PAGE * PAGE
            foff = off + lo - addr
            if (addr - off) % PAGE or foff < 0 or foff + hi - lo > size:
                skipped.append("a buffer not laid out for it")
                continue
            if hi - lo < PAGE:
                continue
            # Read again for each: what the loop allocated or freed
            # since cannot have moved a range it is about to read.
            vmas, files = _remap_vmas()
            k = bisect.bisect_right(vmas, (lo, 1 << 64)) - 1
            if k < 0 or vmas[k][1] < hi:
                skipped.append("a buffer no longer in the session's own memory")
                continue
            # Over an earlier remap every equal page is mapped, however
            # short its run: a page of an earlier file left mapped would
            # keep that whole file alive.
            shortest = 1 if any(a < hi and lo < b for a, b in files) else REMAP_RUN
            there = base + foff
            libc.madvise(there, hi - lo, MADV_POPULATE_READ)
            runs, run = [], None
            step = 256 * PAGE
            for x in range(0, hi - lo, step):
                w = min(step, hi - lo - x)
                if libc.memcmp(lo + x, there + x, w) == 0:
                    pages = [(x, w)]
                else:
                    pages = [(y, PAGE) for y in range(x, x + w, PAGE) if libc.memcmp(lo + y, there + y, PAGE) == 0]
                for y, w in pages:
                    if run is not None and run[1] == y:
                        run[1] = y + w
                    else:
                        if run is not None:
                            runs.append(run)
                        run = [y, y + w]
            if run is not None:
                runs.append(run)
            for a, b in runs:
                if b - a < shortest * PAGE:
                    continue
                # The bytes are equal and nothing can write them before
                # the mapping takes their place.
                got = libc.mmap(lo + a, b - a, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | MAP_FIXED, fd, foff + a)
                if got != lo + a:
                    raise OSError(ctypes.get_errno(), "mmap: %s" % os.strerror(ctypes.get_errno()))
                libc.madvise(lo + a, b - a, MADV_POPULATE_READ)  # its page table, as the memory had
                done += b - a
    finally:
        if collecting:
            gc.enable()
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        libc.munmap(base, size)
    return done, "; ".join(sorted(set(skipped)))


MAP_FIXED = 0x10
# A pagemap entry's top byte -> 1 for a page that reads as its file's (see
# _Reuse._unwritten): absent (no flag), or present and a file page, any
# low flags (exclusive, soft-dirty's neighbours) aside.
_PAGE_OK = bytes(1 if b & 0xE0 in (0x00, 0xA0) else 0 for b in range(256))


_PyBufferType = None


def _PyBuffer():
    global _PyBufferType
    import ctypes

    if _PyBufferType is None:

        class Py_buffer(ctypes.Structure):
            _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                        ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]

        _PyBufferType = Py_buffer
    return _PyBufferType()


def _get_buffer(ctypes, obj, pb, flags):
    """PyObject_GetBuffer: pb.buf is the address of obj's memory."""
    f = ctypes.pythonapi.PyObject_GetBuffer
    f.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
    f.restype = ctypes.c_int
    return f(obj, ctypes.addressof(pb), flags)


def _release_buffer(ctypes, pb):
    f = ctypes.pythonapi.PyBuffer_Release
    f.argtypes = [ctypes.c_void_p]
    f.restype = None
    f(ctypes.addressof(pb))


def _export_child(ns, out, bases=None, by_bytes=False, remap=None):
    """In a forked copy: write ns's variables to out, then the end. bases
    are earlier state files (serial, fd) whose equal buffers are referred
    to rather than copied (_Reuse; by_bytes: proven by comparing them
    only, the baseline of benchmarks). remap, a list, asks for the
    manifest's "remap": [address, offset in the stream, length] of each
    large buffer written (remap_export)."""
    import warnings

    warnings.simplefilter("ignore")  # dill's, on the kernel's stderr between cells
    gc.disable()  # a collection would copy every page of objects it walks
    import pickle

    dill = _LazyDill() if _has_dill() else None
    name = "dill" if dill is not None else "pickle"
    fast = _c_pickler(pickle) if dill is not None else pickle.Pickler
    out.record(b"H", _encode({"version": 2, "serializer": name}).encode())
    saved, not_saved = [], []
    reuse, refs = None, set()
    if bases:
        try:
            reuse = _Reuse(bases, by_bytes)
        except Exception:
            reuse = None  # copied, as without bases
    for key, value in list(ns.items()):
        if key.startswith("__") and key.endswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            out.record(b"M", _encode({"name": key, "module": value.__name__}).encode())
            saved.append(key)
            continue
        kb = key.encode("utf-8", "surrogatepass")
        err = None
        for kind, kw in _pickler_options(dill, value):
            out.record(kind, kb)
            try:
                if kind == b"V":
                    bufs = []
                    fast(_Pieces(out), protocol=5, buffer_callback=bufs.append).dump(value)
                    for i, b in enumerate(bufs):
                        raw = b.raw()
                        at = reuse.find(kb, i, raw) if reuse is not None else None
                        if at is not None:
                            out.record(b"R", struct.pack(">QQQ", at[0], at[1], raw.nbytes))
                            refs.add(at[0])
                            continue
                        # A P record first, so that the buffer starts at a
                        # multiple of BUF_ALIGN in the stream: a kernel that
                        # maps the stream loads aligned arrays over it. A
                        # large one starts where it lies in its page (as
                        # aligned as here), so that the live kernel can map
                        # the file's pages in place of its own afterwards
                        # (remap_export).
                        addr = _buffer_address(raw) if remap is not None and raw.nbytes >= REMAP_MIN else 0
                        if addr and _mmapped_chunk(addr, raw.nbytes):
                            out.record(b"P", bytes((addr - (out.pos + 18)) % PAGE))
                            remap.append([addr, out.pos + 9, raw.nbytes])
                        else:
                            out.record(b"P", bytes(-(out.pos + 18) % BUF_ALIGN))
                        out.record(b"B", raw)
                    del bufs
                else:
                    dill.Pickler(_Pieces(out), protocol=5, **kw).dump(value)
            except BaseException as e:
                out.record(b"X")
                err = e
                continue
            out.record(b"F")
            err = None
            break
        if err is None:
            saved.append(key)
        else:
            not_saved.append({"name": key, "reason": _reason(err)})
    manifest = {"serializer": name, "variables": saved, "not_saved": not_saved, "execution_count": S.count}
    if remap:
        manifest["remap"] = remap
    if refs:
        manifest["refs"] = sorted(refs)
        manifest["compared_bytes"] = reuse.compared
        manifest["mapped_bytes"] = reuse.mapped
    out.record(b"E", _encode(manifest).encode())
    out.end(manifest)


def _pickler_options(dill, value):
    if dill is None:
        return ((b"V", {}),)
    if isinstance(value, type) and getattr(value, "__module__", None) == "__main__":
        return ((b"W", {"byref": False}),)
    # Instances of classes defined in cells refer to the class by name
    # (saved on its own, loaded before them), so they are instances of it
    # after a load; by value when the name does not lead to the class.
    return ((b"V", {}), (b"W", {"byref": True}), (b"W", {"byref": False}))


def _describe():
    return {"threads": _threads_now(), "processes": _processes_now()}


def export_state(ns, req):
    """Streams the variables of the live kernel or of a checkpoint,
    serialized by a forked copy: on the state channel if asked (the reply
    comes at once), else as state_data events and a state_end."""
    cid = int(req.get("checkpoint") or 0)
    cp = None
    if cid:
        cp = _CP.table.get(cid)
        if cp is None:
            _reply({"type": "state_end", "reason": "no checkpoint %d" % cid})
            return
        if _gone(cp):
            _reply({"type": "state_end", "gone": True})
            return
    if req.get("channel") and S.state_sock is not None:
        _export_channel(ns, req, cp)
        return
    r, w = os.pipe()
    with S.lock:  # our threads' events wait until the stream has ended
        if cp is not None:
            try:
                socket.send_fds(cp.sock, [_encode({"op": "export", "tag": S.tag}).encode()], [w])
            except OSError:
                os.close(r)
                os.close(w)
                _write_all(S.ev_fd, _encode({"type": "state_end", "tag": S.tag, "gone": True}).encode() + b"\n")
                return
            os.close(w)
            ended = _forward(r)
            try:
                cp.sock.settimeout(60)
                ack = cp.sock.recv(1 << 16)
                cp.sock.settimeout(None)
            except OSError:
                ack = b""
            status = json.loads(ack).get("status", 0) if ack else -1
        else:
            try:
                pid = os.fork()
            except OSError as e:
                os.close(r)
                os.close(w)
                _write_all(S.ev_fd, _encode({"type": "state_end", "tag": S.tag, "reason": "cannot fork the kernel: %s" % (e.strerror or e)}).encode() + b"\n")
                return
            if pid == 0:
                try:
                    os.close(r)
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    _export_child(ns, _StateOut(w))
                finally:
                    os._exit(0)
            os.close(w)
            ended = _forward(r)
            status = os.waitpid(pid, 0)[1]
            _rebase_children()
        if not ended:
            why = "the process serializing the variables died"
            if status > 0 and os.WIFSIGNALED(status):
                why += " (signal %d%s)" % (os.WTERMSIG(status), ", likely the out-of-memory killer" if os.WTERMSIG(status) == 9 else "")
            _write_all(S.ev_fd, _encode({"type": "state_end", "tag": S.tag, "reason": why}).encode() + b"\n")


def _export_channel(ns, req, cp):
    """export_state on the state channel: a pipe, its read end to the host,
    its write end to a forked copy that writes the records raw; the reply
    comes as soon as the copy exists."""
    info = _describe() if req.get("describe") else {}
    bases = []
    if req.get("bases"):
        fds, m = _channel_fds(S.tag)
        if fds is not None:
            try:
                bases = _serials(m, fds, 0)
            except ValueError:
                for fd in fds:
                    os.close(fd)
    try:
        _export_fork(ns, req, cp, info, bases)
    finally:
        for _, fd in bases:
            os.close(fd)


def _export_fork(ns, req, cp, info, bases):
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, F_SETPIPE_SZ, STATE_PIPE)
    except OSError:
        pass  # above /proc/sys/fs/pipe-max-size: the default size
    with S.lock:
        if cp is not None:
            try:
                socket.send_fds(cp.sock, [_encode({"op": "export", "tag": S.tag, "raw": True}).encode()], [w])
                cp.sock.settimeout(60)
                ack = json.loads(cp.sock.recv(1 << 16) or b"{}")
                cp.sock.settimeout(None)
            except (OSError, ValueError):
                ack = {"gone": True}
            os.close(w)
            if not ack.get("ok"):
                os.close(r)
                ev = {"type": "state_export"}
                if ack.get("gone"):
                    ev["gone"] = True
                else:
                    ev["reason"] = "cannot fork the checkpoint: %s" % ack.get("reason", "")
                _reply(ev)
                return
        else:
            try:
                pid = os.fork()
            except OSError as e:
                os.close(r)
                os.close(w)
                _reply({"type": "state_export", "reason": "cannot fork the kernel: %s" % (e.strerror or e)})
                return
            if pid == 0:
                try:
                    os.close(r)
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    _export_child(ns, _RawOut(w), bases, bool(req.get("by_bytes")), [] if req.get("remap") else None)
                    os.close(w)  # the end, before the exit tears the copy of the memory down
                finally:
                    os._exit(0)
            os.close(w)
            _CP.reap.append(pid)  # reaped at a later request (it is not the user's process)
    try:
        socket.send_fds(S.state_sock, [_encode({"tag": S.tag}).encode()], [r])
    except OSError as e:
        os.close(r)
        _reply({"type": "state_export", "reason": "cannot pass the state stream: %s" % (e.strerror or e)})
        return
    os.close(r)
    ev = {"type": "state_export"}
    ev.update(info)
    _reply(ev)


def _forward(r):
    """Copies the complete event lines read from r to the event pipe;
    reports whether the last was the state_end."""
    pend = b""
    last = b""
    while True:
        b = os.read(r, 1 << 20)
        if not b:
            break
        pend += b
        i = pend.rfind(b"\n")
        if i >= 0:
            out, pend = pend[: i + 1], pend[i + 1 :]
            _write_all(S.ev_fd, out)
            j = out.rfind(b"\n", 0, len(out) - 1)
            last = out[j + 1 : j + 40]
    os.close(r)
    return last.startswith(b'{"type":"state_end"')


class _LineSource:
    """A state stream read from request lines {"chunk": base64} up to
    {"end": true}."""

    def __init__(self):
        self.buf = memoryview(b"")
        self.done = False
        self.gone = False  # the request pipe ended
        self.abort = None

    def _more(self):
        if self.done:
            return False
        line = S.req.readline()
        if not line:
            self.gone = self.done = True
            return False
        if line.startswith(b'{"chunk":"') and line.endswith(b'"}\n'):
            chunk = line[10:-3]  # as the host writes it: no JSON decoder for megabytes of base64
        else:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = {}
            if msg.get("end"):
                self.done = True
                if msg.get("abort"):
                    self.abort = str(msg.get("abort"))
                return False
            chunk = msg.get("chunk") or ""
        self.buf = memoryview(base64.b64decode(chunk))
        return True

    def readinto(self, view):
        n = 0
        while n < len(view):
            if not self.buf:
                if not self._more():
                    break
                continue
            k = min(len(view) - n, len(self.buf))
            view[n : n + k] = self.buf[:k]
            self.buf = self.buf[k:]
            n += k
        return n

    def finish(self):
        while self._more():
            pass


class _FdSource:
    """A state stream read raw from a pipe of the state channel."""

    gone = False
    abort = None

    def __init__(self, fd):
        self.f = io.FileIO(fd, "rb", closefd=True)

    def readinto(self, view):
        n = 0
        while n < len(view):
            k = self.f.readinto(view[n:])
            if not k:
                break
            n += k
        return n

    def finish(self):
        self.f.close()


_KINDS = frozenset(b"HMVWDBFXEPR")


class _MapSource:
    """A state stream in a sealed state file (a memfd the host wrote and
    sealed), mapped copy-on-write: its buffers are taken as views of the
    mapping, not copied, so the arrays loaded over them share the file's
    pages with every kernel that mapped it until written to; a write makes
    a private copy of the page (MAP_PRIVATE), which no other kernel sees.
    The mapping lives as long as one of those arrays does."""

    gone = False
    abort = None

    def __init__(self, fd, size):
        # mmap(2) through ctypes: Python's mmap module keeps a duplicate
        # of the descriptor open for as long as the mapping lives, which
        # user code would find in /proc/self/fd.
        import ctypes
        import mmap
        import weakref

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
            if addr is None or addr == ctypes.c_void_p(-1).value:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        finally:
            os.close(fd)
        mem = (ctypes.c_char * size).from_address(addr)
        # Unmapped when the last array loaded over it is gone.
        weakref.finalize(mem, libc.munmap, addr, size).atexit = False
        self.view = memoryview(mem).cast("B")
        self.off = 0
        self.bases = {}  # serial -> _MapSource: the earlier state files R records refer to

    def ref(self, serial, off, n):
        """The bytes an R record refers to: a view of a base's mapping."""
        base = self.bases.get(serial)
        if base is None:
            raise ValueError("a reference to a state file the host did not pass")
        if off + n > len(base.view):
            raise ValueError("a reference past the end of a state file")
        return base.view[off : off + n]

    def readinto(self, view):
        n = max(0, min(len(view), len(self.view) - self.off))
        view[:n] = self.view[self.off : self.off + n]
        self.off += n
        return n

    def take(self, n):
        if self.off + n > len(self.view):
            raise EOFError
        v = self.view[self.off : self.off + n]
        self.off += n
        return v

    def finish(self):
        self.view = memoryview(b"")
        for b in self.bases.values():
            b.finish()
        self.bases = {}


def _load_stream(ns, src):
    """Loads the records read from src into ns; returns (loaded, not_saved,
    manifest or None, error or None)."""
    pickle = dill = None
    head = None
    key, kind_of, data, bufs = None, None, None, None
    loaded, not_saved = [], []
    hdr = bytearray(9)
    hv = memoryview(hdr)

    take = getattr(src, "take", None)

    def read(n):
        if take is not None:
            return take(n)  # a view of the mapped stream
        b = bytearray(n)
        if src.readinto(memoryview(b)) != n:
            raise EOFError
        return b

    try:
        while True:
            got = src.readinto(hv)
            if got != 9:
                if src.abort:
                    return loaded, not_saved, None, "the state stream was cut short: " + src.abort
                return loaded, not_saved, None, "the state stream ended early"
            kind = hdr[0]
            n = struct.unpack_from(">Q", hdr, 1)[0]
            if kind not in _KINDS or (head is None and kind != ord("H")):
                raise ValueError("not a state stream")
            if kind not in b"DB" and n > 64 << 20:
                raise ValueError("not a state stream (a record of %d bytes)" % n)
            payload = read(n)
            if kind not in b"DB":
                payload = bytes(payload)
            if kind == ord("P"):
                continue
            if kind == ord("D"):
                if data is None:
                    raise ValueError("a piece outside a variable")
                if len(data):
                    if not isinstance(data, bytearray):
                        data = bytearray(data)
                    data += payload
                else:
                    data = payload
            elif kind == ord("R"):
                if bufs is None:
                    raise ValueError("a buffer outside a variable")
                ref = getattr(src, "ref", None)
                if ref is None or n != 24:
                    raise ValueError("a reference to another state file in a stream that is not mapped")
                bufs.append(ref(*struct.unpack(">QQQ", payload)))
            elif kind == ord("B"):
                if bufs is None:
                    raise ValueError("a buffer outside a variable")
                bufs.append(payload)  # writable (a bytearray, or a view of a private mapping): arrays loaded on it are too
            elif kind == ord("H"):
                head = json.loads(payload)
                if head.get("version") not in (1, 2):
                    raise ValueError("a state stream of version %s" % head.get("version"))
                import pickle

                dill = _LazyDill() if _has_dill() else None
                if head.get("version") == 1 and head.get("serializer") == "dill" and dill is None:
                    raise ValueError("the state was saved with dill, which this kernel cannot import")
            elif kind == ord("M"):
                m = json.loads(payload)
                try:
                    import importlib

                    ns[m["name"]] = importlib.import_module(m["module"])
                    loaded.append(m["name"])
                except BaseException as e:
                    not_saved.append({"name": m["name"], "reason": "import %s: %s" % (m["module"], _reason(e))})
            elif kind in (ord("V"), ord("W")):
                key = payload.decode("utf-8", "surrogatepass")
                kind_of = kind
                if head.get("version") == 1:
                    kind_of = ord("W") if head.get("serializer") == "dill" else ord("V")
                data, bufs = bytearray(), []
            elif kind == ord("X"):
                key, data, bufs = None, None, None
            elif kind == ord("F"):
                if key is None:
                    raise ValueError("the end of no variable")
                try:
                    if kind_of == ord("W"):
                        if dill is None:
                            raise ValueError("it was saved with dill, which this kernel cannot import")
                        ns[key] = dill.loads(data)
                    else:
                        ns[key] = pickle.loads(data, buffers=bufs)
                    loaded.append(key)
                except BaseException as e:
                    not_saved.append({"name": key, "reason": _reason(e)})
                key, data, bufs = None, None, None
            elif kind == ord("E"):
                return loaded, not_saved, json.loads(payload), None
    except EOFError:
        return loaded, not_saved, None, "the state stream ended early"
    except Exception as e:
        return loaded, not_saved, None, "cannot load the state: %s" % _reason(e)


def _channel_fd(tag):
    """The pipe the host passed on the state channel for request tag."""
    fds, _ = _channel_fds(tag)
    if fds is None:
        return None
    if len(fds) == 1:
        return fds[0]
    for fd in fds:
        os.close(fd)
    return None


def _channel_fds(tag):
    """The descriptors the host passed on the state channel for request
    tag, and its message; (None, None) if none came."""
    flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
    S.state_sock.settimeout(10)
    try:
        while True:
            msg, fds, _, _ = socket.recv_fds(S.state_sock, 4096, MAX_STATE_FILES, flags)
            if not msg:
                return None, None
            try:
                m = json.loads(msg)
            except ValueError:
                m = {}
            if m.get("tag") == tag and fds:
                return fds, m
            for fd in fds:
                os.close(fd)
    except OSError:
        return None, None
    finally:
        S.state_sock.settimeout(None)


def _serials(m, fds, first):
    """Pairs the serials of the host's message m with fds[first:]."""
    serials = m.get("serials") or []
    if not isinstance(serials, list) or len(serials) != len(fds) - first:
        raise ValueError("the host passed %d state files for %d serials" % (len(fds) - first, len(serials)))
    return [(int(n), fd) for n, fd in zip(serials, fds[first:])]


def import_state(ns, req):
    """Loads a stream written by export_state: raw from the pipe the host
    passed on the state channel, or from request lines {"chunk": base64}
    up to {"end": true}. Returns False if the request pipe ended."""
    if req.get("channel") and S.state_sock is not None:
        fds, m = _channel_fds(S.tag)
        if fds is None:
            _reply({"type": "import_state", "reason": "the host passed no state stream"})
            return True
        fd = fds[0]
        try:
            bases = _serials(m, fds, 1)
        except ValueError as e:
            for f in fds:
                os.close(f)
            _reply({"type": "import_state", "reason": _reason(e)})
            return True
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_size > 0:
            left = list(bases)  # each _MapSource closes its descriptor
            try:
                src = _MapSource(fd, st.st_size)
                while left:
                    serial, bfd = left.pop(0)
                    src.bases[serial] = _MapSource(bfd, os.fstat(bfd).st_size)
            except (OSError, ValueError) as e:
                for _, bfd in left:
                    os.close(bfd)
                _reply({"type": "import_state", "reason": "cannot map the state: %s" % _reason(e)})
                return True
        else:
            for _, bfd in bases:
                os.close(bfd)
            src = _FdSource(fd)
    else:
        src = _LineSource()
    loaded, not_saved, exported, error = _load_stream(ns, src)
    src.finish()
    if src.gone:
        return False  # the host is gone
    if error is None and src.abort:
        error = "the state stream was cut short: " + src.abort
    if error is not None:
        _reply({"type": "import_state", "reason": error, "manifest": {"variables": loaded, "not_saved": not_saved}})
        return True
    # Random state: a copy must not repeat its source's draws.
    rnd = sys.modules.get("random")
    if rnd is not None:
        rnd.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:
            pass
    S.count = int(exported.get("execution_count") or 0)
    manifest = {"serializer": exported.get("serializer"), "variables": loaded,
                "not_saved": (exported.get("not_saved") or []) + not_saved, "execution_count": S.count}
    _reply({"type": "import_state", "manifest": manifest})
    return True


def _text_stream(fd):
    # Line buffered: one write per line keeps print() fast and streaming.
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )


def _setup():
    # The Go side's output pipes come as fds 5 and 6: make them stdout and
    # stderr, so output written at the descriptor level reaches it too.
    os.dup2(5, 1)
    os.dup2(6, 2)
    os.close(5)
    os.close(6)
    # Our own copies for markers: they still reach the Go side if user code
    # redirects or closes fds 1 and 2.
    S.out_fd = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 100)
    S.err_fd = fcntl.fcntl(2, fcntl.F_DUPFD_CLOEXEC, 100)
    S.req = _Reader(fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, 100))
    S.ev_fd = fcntl.fcntl(4, fcntl.F_DUPFD_CLOEXEC, 100)
    os.close(3)
    os.close(4)
    _state_channel()
    try:
        S.clear_refs_fd = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        S.clear_refs_fd = -1

    sys.stdout = sys.__stdout__ = _text_stream(1)
    sys.stderr = sys.__stderr__ = _text_stream(2)
    try:
        import faulthandler

        faulthandler.enable(file=sys.stderr, all_threads=True)
    except Exception:
        pass
    signal.signal(signal.SIGINT, _on_sigint)

    sys.meta_path.append(_BackendFinder)
    builtins.display = display
    builtins.input = _input
    builtins.__sandloop_shell__ = _shell
    os.system = _system

    # User code runs in a fresh __main__ so pickling and multiprocessing find
    # its classes; the kernel's own globals stay out of sight.
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(KERNEL_FILE):
        sys.path[0] = ""
    return main.__dict__


def _state_channel():
    """Takes fd 7 as the state channel if it is one (a unix seqpacket
    socket: a launcher may not pass it, or pass something else)."""
    try:
        st = os.fstat(7)
    except OSError:
        return
    try:
        if not (st.st_mode & 0o170000 == 0o140000):
            return
        s = socket.socket(fileno=fcntl.fcntl(7, fcntl.F_DUPFD_CLOEXEC, 100))
        if s.family != socket.AF_UNIX or s.type != socket.SOCK_SEQPACKET:
            s.close()
            return
        S.state_sock = s
    except OSError:
        pass
    finally:
        os.close(7)


def main():
    S.first_pid = os.getpid()
    S.jailed = os.getppid() == 1
    ns = _setup()
    hello = json.loads(S.req.readline() or b"{}")
    S.max_event = int(hello.get("max_event_bytes") or S.max_event)
    S.token = str(hello.get("token", "")).encode()
    _reply({"type": "ready", "pid": os.getpid(), "python": sys.version.split()[0], "state_channel": S.state_sock is not None})
    readline = S.req.readline
    loads = json.loads
    while True:
        line = readline()
        if not line:
            return
        S.in_user = False
        try:
            req = loads(line)
        except ValueError:
            continue
        op = req.get("op", "execute")
        S.tag = req.get("tag") or 0
        if _CP.reap:
            _reap_dropped()
        if op == "execute":
            run_cell(ns, req)
        elif op == "is_complete":
            _reply({"type": "is_complete", "status": is_complete(req.get("code", ""))})
        elif op == "setenv":
            # The host's, between cells: a pooled kernel handed to a session
            # gets the session's variables (the egress proxy's).
            os.environ.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
            _reply({"type": "setenv"})
        elif op == "checkpoint":
            checkpoint(ns)
        elif op == "restore":
            restore(req)
        elif op == "drop_checkpoint":
            drop_checkpoint(req)
        elif op == "checkpoint_memory":
            checkpoint_memory()
        elif op == "export_state":
            export_state(ns, req)
        elif op == "remap_export":
            if S.state_sock is None:
                _reply({"type": "remap_export", "reason": "no state channel"})
            else:
                remap_export(req)
        elif op == "sync":
            # A server taking the kernel over (package keeper): everything
            # before this reply is what the server before left unread.
            # Its checkpoints are listed: the new server has no record of
            # them and drops them.
            _reply({"type": "sync", "execution_count": S.count, "checkpoints": sorted(_CP.table)})
        elif op == "describe":
            ev = {"type": "describe"}
            ev.update(_describe())
            _reply(ev)
        elif op == "import_state":
            if not import_state(ns, req):
                return


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    os._exit(0)

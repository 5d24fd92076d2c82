"""sandloop kernel: runs code cells like a notebook, inside a jail.

Standard library only. The Go side (internal/kernel) starts this program with:
  fd 3  requests, one JSON object per line
  fd 4  events, one JSON object per line
  fd 5, fd 6  pipes the Go side reads as the cell's stdout and stderr; the
        kernel moves them to fds 1 and 2
The first request is a hello with settings and a random token. Output is
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
import io
import json
import linecache
import os
import resource
import signal
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
    req = None
    ev_fd = -1
    clear_refs_fd = -1
    child_cpu = 0.0
    child_peak = 0
    lock = threading.Lock()
    shown = set()  # ids of figures already emitted in this cell


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
    S.req = os.fdopen(fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, 100), "rb", buffering=1 << 16)
    S.ev_fd = fcntl.fcntl(4, fcntl.F_DUPFD_CLOEXEC, 100)
    os.close(3)
    os.close(4)
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


def main():
    ns = _setup()
    hello = json.loads(S.req.readline() or b"{}")
    S.max_event = int(hello.get("max_event_bytes") or S.max_event)
    S.token = str(hello.get("token", "")).encode()
    _reply({"type": "ready", "pid": os.getpid(), "python": sys.version.split()[0]})
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
        if op == "execute":
            run_cell(ns, req)
        elif op == "is_complete":
            _reply({"type": "is_complete", "status": is_complete(req.get("code", ""))})
        elif op == "setenv":
            # The host's, between cells: a pooled kernel handed to a session
            # gets the session's variables (the egress proxy's).
            os.environ.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
            _reply({"type": "setenv"})


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    os._exit(0)

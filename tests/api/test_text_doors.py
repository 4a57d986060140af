"""Every door refuses text that no store or peer can take, naming the field: a property test.

The doors are read from the server at run time, so a new one is covered without touching this
file: every HTTP operation of the served OpenAPI document (each string field of its JSON body,
found by walking the body's schema through refs, unions, arrays and maps, map keys included;
each query parameter; each header it declares, and Authorization) and every method of the gRPC
services registered on the server's descriptor pool (each string field of its request message,
repeated and map fields included, nested messages followed).

Into one door at a time goes a value that Hypothesis draws of one of four kinds, around a
request that is otherwise valid (the base request must succeed, so a refusal is the value's):

- a NUL character, which PostgreSQL refuses in a bound value;
- a lone UTF-16 surrogate: in a JSON body as the escape ``\\udfff`` (httpx cannot encode the
  character otherwise), in a URL or header as its would-be UTF-8 bytes (``%ED%BF%BF``), on gRPC
  as those bytes in the wire format;
- overlong or otherwise invalid UTF-8: raw bytes in the body, URL, header or wire format;
- a huge value: past every field's limit (over the question's 100,000 characters) but within
  the 2 MiB body limit, so the field's own limit must refuse it.

The answer must be a 4xx whose error names the field (INVALID_ARGUMENT with the field in the
details, on gRPC), never a 5xx and never an acceptance; on SQLite and on PostgreSQL. HTTP goes
over http.client, which sends header bytes and bodies as given (httpx and h11 refuse them).

Hypothesis draws a few values per door and kind (EXAMPLES), so the run stays in seconds; the
doors and kinds themselves are all visited, each as a subtest.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor.orchestration import MAX_QUESTION_CHARS
from conductor_adapters.rpc.v1 import workflows_pb2
from conductor_adapters.store.keys import create_key

from fakes.api_server import LiveApi, scripted_service
from fakes.scripted import ScriptedWorker

pytestmark = [pytest.mark.slow]

WORKERS = ("alpha", "beta")
KINDS = ("nul", "surrogate", "overlong", "huge")
EXAMPLES = 2  # Hypothesis values per door and kind
DRAWS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Stands in a JSON body for bytes that JSON cannot carry (invalid UTF-8), swapped in encoded.
HOLE = "\u2603HOLE\u2603"
INVALID_UTF8 = (
    b"\xc0\x80",  # an overlong NUL
    b"\xc1\xbf",
    b"\xe0\x80\xaf",  # an overlong '/'
    b"\xf0\x80\x80\xaf",
    b"\xed\xbf\xbf",  # a surrogate's would-be UTF-8 (CESU)
    b"\xed\xa0\x80",
    b"\xff",
    b"\x80",
)
# Past every field's limit (the question's is the largest), within the 2 MiB body limit even
# as JSON escapes (six bytes a character).
HUGE_BODY = (MAX_QUESTION_CHARS + 1, 300_000)
# Past every parameter's and header's limit; a URL or a header has less room than a body.
HUGE_LINE = (8_193, 20_000)
REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Bad:
    """A drawn value: text for JSON (``raw`` None) or bytes that go out as they are."""

    kind: str
    text: str
    raw: bytes | None = None

    def __repr__(self) -> str:  # a huge one is not printed whole
        shown = self.text if len(self.text) < 80 else f"{self.text[:20]}...({len(self.text)})"
        return f"Bad({self.kind}, {shown!r}, {self.raw!r})"

    def utf8(self) -> bytes:
        """As bytes on the wire (a URL, a header, protobuf): a surrogate as its CESU bytes."""
        if self.raw is not None:
            return self.raw
        return self.text.encode("utf-8", "surrogatepass")


_AROUND = st.text(alphabet="abcXYZ019 -_", max_size=6)


def bad_values(kind: str, *, huge: tuple[int, int]) -> st.SearchStrategy[Bad]:
    if kind == "nul":
        return st.builds(lambda a, b: Bad(kind, f"{a}\x00{b}"), _AROUND, _AROUND)
    if kind == "surrogate":
        lone = st.integers(0xD800, 0xDFFF).map(chr)
        return st.builds(lambda a, s, b: Bad(kind, f"{a}{s}{b}"), _AROUND, lone, _AROUND)
    if kind == "overlong":
        return st.builds(
            lambda a, x, b: Bad(kind, f"{a}{HOLE}{b}", a.encode() + x + b.encode()),
            _AROUND,
            st.sampled_from(INVALID_UTF8),
            _AROUND,
        )
    assert kind == "huge"
    return st.builds(
        lambda n, c: Bad(kind, c * n), st.integers(*huge), st.sampled_from(["x", "é", "7"])
    )


# -- the target -----------------------------------------------------------------------------


@dataclass
class Target:
    api: LiveApi
    key: str
    workflow: str  # a finished workflow of the key's tenant
    response: str  # a stored response of the key's tenant
    document: dict[str, Any]


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    if request.param == "sqlite":
        database_url = f"sqlite:///{Path(tmp_path_factory.mktemp('doors')) / 'conductor.db'}"
    else:
        database_url = request.getfixturevalue("module_postgres_url")
    api = LiveApi(lambda: scripted_service(database_url, [ScriptedWorker(n) for n in WORKERS]))
    try:
        key = create_key(api.service.engine, "doors").secret
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=api.url, headers=auth, timeout=30) as client:
            accepted = client.post("/v1/workflows", json={"question": "What is 6*7?"})
            assert accepted.status_code == 202, accepted.text
            workflow = accepted.json()["id"]
            deadline = time.monotonic() + 30
            while client.get(f"/v1/workflows/{workflow}").json()["status"] not in (
                "completed",
                "failed",
            ):
                assert time.monotonic() < deadline, "the workflow did not finish in 30 s"
                time.sleep(0.02)
            stored = client.post("/v1/responses", json={"model": "alpha", "input": "Hi."})
            assert stored.status_code == 200, stored.text
            document = client.get("/openapi.json").json()
        yield Target(api, key, workflow, stored.json()["id"], document)
    finally:
        api.close()


# -- HTTP -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def error(self) -> dict[str, Any]:
        try:
            error = json.loads(self.body)["error"]
        except (ValueError, KeyError, TypeError):
            raise AssertionError(f"{self.status}, no error object: {self.body[:300]!r}") from None
        assert isinstance(error, dict)
        return error


def send(
    target: Target,
    method: str,
    path: str,
    *,
    query: bytes = b"",
    headers: dict[str, bytes] | None = None,
    body: bytes | None = None,
) -> Answer:
    host, port = urllib.parse.urlsplit(target.api.url).netloc.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT_S)
    try:
        sent = {"Authorization": f"Bearer {target.key}".encode(), **(headers or {})}
        if body is not None:
            sent["Content-Type"] = b"application/json"
        url = path + ("?" + query.decode("ascii") if query else "")
        connection.request(method, url, body=body, headers=sent)
        response = connection.getresponse()
        return Answer(response.status, response.read())
    finally:
        connection.close()


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = document["components"]["schemas"][name]
    return schema


def minimal(document: dict[str, Any], schema: dict[str, Any], aims: dict[str, Any]) -> Any:
    """The smallest value ``schema`` takes: required properties only (``aims`` gives the value
    of a property by name where any would not do, e.g. an existing model)."""
    schema = resolve(document, schema)
    for union in ("anyOf", "oneOf"):
        if union in schema:
            options = [resolve(document, s) for s in schema[union]]
            chosen = next((s for s in options if s.get("type") != "null"), options[0])
            return minimal(document, chosen, aims)
    kind = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    if kind == "object":
        # The required properties, and those ``aims`` names (a chat message's content).
        wanted = [
            *schema.get("required", []),
            *(n for n in schema.get("properties", {}) if n in aims),
        ]
        return {
            name: aims[name]
            if name in aims
            else minimal(document, schema["properties"][name], aims)
            for name in dict.fromkeys(wanted)
        }
    if kind == "array":
        return [minimal(document, schema["items"], aims)] * schema.get("minItems", 0)
    if kind == "string":
        return "hi" + "x" * max(0, schema.get("minLength", 0) - 2)
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    return None


Build = Callable[[Any], Any]  # the bad value -> the body (or the part of it) that carries it
Build3 = tuple[bytes, dict[str, bytes], bytes | None, str]  # query, headers, body, path


def string_fields(
    document: dict[str, Any], schema: dict[str, Any], aims: dict[str, Any], depth: int = 0
) -> Iterator[tuple[tuple[str, ...], Build]]:
    """Each place a string goes in a value of ``schema``: its path (property names, ``0`` for
    an array's item, ``*`` for a map's value and ``<key>`` for a map's key) and how to build a
    value of ``schema`` with a given string there."""
    schema = resolve(document, schema)
    if depth > 8:
        return
    for union in ("anyOf", "oneOf"):
        for option in schema.get(union, []):
            yield from string_fields(document, option, aims, depth + 1)
    kind = schema.get("type")
    if kind == "string":
        yield (), lambda bad: bad
    elif kind == "array" and "items" in schema:
        for path, build in string_fields(document, schema["items"], aims, depth + 1):
            yield ("0", *path), lambda bad, build=build: [build(bad)]
    elif kind == "object":
        base = minimal(document, schema, aims)
        for name, sub in schema.get("properties", {}).items():
            for path, build in string_fields(document, sub, aims, depth + 1):
                yield (name, *path), lambda bad, n=name, b=build: {**base, n: b(bad)}
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for path, build in string_fields(document, extra, aims, depth + 1):
                yield ("*", *path), lambda bad, b=build: {**base, "k": b(bad)}
            yield ("<key>",), lambda bad: {**base, bad: minimal(document, extra, aims)}


def encode(body: Any, bad: Bad) -> bytes:
    """JSON with escapes for everything past ASCII (so a lone surrogate goes as ``\\udfff``),
    and the bad bytes, where there are some, where the hole is."""
    encoded = json.dumps(body, ensure_ascii=True).encode("ascii")
    if bad.raw is None:
        return encoded
    hole = json.dumps(HOLE, ensure_ascii=True)[1:-1].encode("ascii")
    assert hole in encoded
    return encoded.replace(hole, bad.raw)


@dataclass(frozen=True)
class Door:
    method: str
    path: str  # with its path parameters filled in
    where: str  # body, query, header or path
    field: str  # as a client would name it
    build: Callable[[Bad], tuple[bytes, dict[str, bytes], bytes | None, str]]

    @property
    def label(self) -> str:
        return f"{self.method} {self.path} {self.where} {self.field}"


def _names(field: str) -> tuple[str, ...]:
    """Words that name the field in an error: one of its last two named parts (a map's key
    or value is named by the map, a part of a message's content by the content), and for an
    id in a path the thing it names (404 "response X not found")."""
    parts = [p for p in field.split(".") if p not in ("0", "*", "<key>")] or [field]
    return (*parts[-2:], parts[-1].removesuffix("_id"))


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # with its path parameters filled in
    body: bytes | None  # the smallest valid JSON body, where it takes one


def http_doors(target: Target) -> tuple[list[Operation], list[Door]]:
    """The served document's operations (each with a valid request) and their doors."""
    document = target.document
    known = {
        "model": "alpha",
        "workflow_id": target.workflow,
        "response_id": target.response,
        "content": "Hi.",
    }
    operations: list[Operation] = []
    doors: list[Door] = []
    for template, methods in document["paths"].items():
        for method, spec in methods.items():
            method = method.upper()
            path = template.format(**known)
            content = spec.get("requestBody", {}).get("content", {})
            schema = content.get("application/json", {}).get("schema")
            base = None
            if schema is not None:
                base = json.dumps(minimal(document, schema, known)).encode()
            operations.append(Operation(method, path, base))
            for parameter in spec.get("parameters", []):
                where, name = parameter["in"], parameter["name"]
                if where == "query":

                    def query(
                        bad: Bad, name: str = name, path: str = path, base: Any = base
                    ) -> Any:
                        value = urllib.parse.quote_from_bytes(bad.utf8(), safe="")
                        return f"{name}={value}".encode(), {}, base, path

                    doors.append(Door(method, path, "query", name, query))
                elif where == "header":

                    def header(
                        bad: Bad, name: str = name, path: str = path, base: Any = base
                    ) -> Any:
                        return b"", {name: bad.utf8()}, base, path

                    doors.append(Door(method, path, "header", name, header))
                elif where == "path":

                    def in_path(
                        bad: Bad, name: str = name, template: str = template, base: Any = base
                    ) -> Any:
                        value = urllib.parse.quote_from_bytes(bad.utf8(), safe="")
                        return b"", {}, base, template.format(**{**known, name: value})

                    doors.append(Door(method, template, "path", name, in_path))
            if template.startswith("/v1/"):

                def authorization(bad: Bad, path: str = path, base: Any = base) -> Any:
                    return b"", {"Authorization": b"Bearer " + bad.utf8()}, base, path

                doors.append(Door(method, path, "header", "Authorization", authorization))
            if schema is None:
                continue
            for field_path, build_body in string_fields(document, schema, known):

                def body(bad: Bad, build_body: Build = build_body, path: str = path) -> Any:
                    return b"", {}, encode(build_body(bad.text), bad), path

                doors.append(Door(method, path, "body", ".".join(field_path), body))
    return operations, doors


def check_http(target: Target, door: Door, bad: Bad) -> None:
    query, headers, body, path = door.build(bad)
    answer = send(target, door.method, path, query=query, headers=headers, body=body)
    said = (
        f"{door.label} with {bad.kind} {bad.utf8()[:60]!r}: {answer.status} {answer.body[:300]!r}"
    )
    assert 400 <= answer.status < 500, said
    if door.where != "body" and answer.body.startswith(b"Invalid HTTP request"):
        # uvicorn's HTTP parser refuses a NUL in a header, and a request line or header past
        # its limits, before any code of the API sees them: a 400 that names nothing.
        assert bad.kind in ("nul", "huge"), said
        return
    error = answer.error()
    text = f"{error.get('param') or ''} {error['message']}"
    names = ("API key",) if door.field == "Authorization" else _names(door.field)
    assert any(name.lower() in text.lower() for name in names), f"not named: {said}"


# -- gRPC -----------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def wire_strings(
    descriptor: Descriptor, depth: int = 0
) -> Iterator[tuple[str, Callable[[bytes], bytes]]]:
    """Each string field of ``descriptor``, nested ones followed: its path and the wire bytes
    of a message part that puts given bytes there (appended to a message, protobuf's merge
    rule makes them the field's value: the last one for a singular field, one more for a
    repeated or map field)."""
    if depth > 4:
        return
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            yield field.name, lambda raw, n=field.number: _length_delimited(n, raw)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            entry = field.message_type
            is_map = entry.GetOptions().map_entry
            for name, part in wire_strings(entry, depth + 1):
                if is_map:  # the entry's other string a valid one
                    other = 2 if name == "key" else 1
                    fill = _length_delimited(other, b"v")
                    label = f"{field.name}.<key>" if name == "key" else f"{field.name}.*"
                else:
                    fill, label = b"", f"{field.name}.{name}"
                yield (
                    label,
                    lambda raw, n=field.number, p=part, f=fill: _length_delimited(n, f + p(raw)),
                )


def grpc_methods() -> list[MethodDescriptor]:
    pool = descriptor_pool.Default()
    service = workflows_pb2.DESCRIPTOR.services_by_name  # the file that registers them
    methods = []
    for name in service:
        methods.extend(pool.FindServiceByName(f"conductor.v1.{name}").methods)
    return methods


def grpc_base(method: MethodDescriptor, target: Target) -> bytes:
    """A valid request of ``method``: an existing workflow, a question where one is asked."""
    values = {"workflow_id": target.workflow, "question": "What is 6*7?"}
    fields = {f.name for f in method.input_type.fields}
    return b"".join(
        _length_delimited(f.number, values[f.name].encode())
        for f in method.input_type.fields
        if f.name in values and f.name in fields and f.type == FieldDescriptor.TYPE_STRING
    )


def call(target: Target, method: MethodDescriptor, request: bytes) -> tuple[grpc.StatusCode, str]:
    """The status of ``method`` called with the wire bytes ``request``, and its details."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    metadata = (("authorization", f"Bearer {target.key}"),)
    with grpc.insecure_channel(target.api.grpc_address) as channel:
        try:
            if method.server_streaming:
                stream = channel.unary_stream(path)
                for _ in stream(request, metadata=metadata, timeout=REQUEST_TIMEOUT_S):
                    pass
            else:
                channel.unary_unary(path)(request, metadata=metadata, timeout=REQUEST_TIMEOUT_S)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def check_grpc(
    target: Target, method: MethodDescriptor, field: str, request: bytes, bad: Bad
) -> None:
    code, details = call(target, method, request)
    said = f"{method.name} {field} with {bad.kind} {bad.utf8()[:60]!r}: {code.name} {details[:300]}"
    assert code == grpc.StatusCode.INVALID_ARGUMENT, said
    assert any(name in details for name in _names(field)), f"not named: {said}"


# -- the tests ------------------------------------------------------------------------------


def _run(strategy: st.SearchStrategy[Bad], check: Callable[[Bad], None]) -> None:
    @DRAWS
    @given(bad=strategy)
    def drawn(bad: Bad) -> None:
        check(bad)

    drawn()


def test_http_doors(target: Target, subtests: pytest.Subtests) -> None:
    """Every string a client sends over HTTP: a 4xx naming the field for each kind of bad
    value, never a 5xx or an acceptance."""
    operations, doors = http_doors(target)
    assert len(doors) > 50, [d.label for d in doors]  # the walk found the bodies' fields
    # DELETE last: it deletes the stored response the others read.
    for operation in sorted(operations, key=lambda o: o.method == "DELETE"):
        if not operation.path.startswith("/v1/"):
            continue  # no door: /healthz, /readyz and /metrics read nothing a client sends
        with subtests.test(msg=f"{operation.method} {operation.path} base"):
            answer = send(target, operation.method, operation.path, body=operation.body)
            said = f"{operation.method} {operation.path}: {answer.status} {answer.body[:300]!r}"
            assert answer.status < 400, said  # so that a refusal below is the value's
    for door in doors:
        for kind in KINDS:
            huge = HUGE_BODY if door.where == "body" else HUGE_LINE
            with subtests.test(msg=f"{door.label} {kind}"):
                _run(
                    bad_values(kind, huge=huge),
                    lambda bad, door=door: check_http(target, door, bad),
                )


def test_grpc_doors(target: Target, subtests: pytest.Subtests) -> None:
    """Every string field of every gRPC request: INVALID_ARGUMENT naming the field."""
    methods = grpc_methods()
    assert {m.name for m in methods} >= {"Submit", "Get", "Watch", "Cancel", "List"}
    for method in methods:
        base = grpc_base(method, target)
        with subtests.test(msg=f"{method.name} base"):
            code, details = call(target, method, base)
            assert code == grpc.StatusCode.OK, f"{method.name}: {code.name} {details}"
        for field, part in wire_strings(method.input_type):
            for kind in KINDS:
                with subtests.test(msg=f"{method.name} {field} {kind}"):
                    _run(
                        bad_values(kind, huge=HUGE_BODY),
                        lambda bad, m=method, f=field, p=part, b=base: check_grpc(
                            target, m, f, b + p(bad.utf8()), bad
                        ),
                    )

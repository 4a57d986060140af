"""The committed gRPC code matches protos/, and its messages survive the wire."""

from __future__ import annotations

import importlib.util
import shutil
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SRC = REPO_ROOT / "src" / "conductor_adapters" / "rpc"


def _load_script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_protos = _load_script(REPO_ROOT / "scripts" / "gen_protos.py")


def test_committed_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    written = gen_protos.generate(tmp_path)

    stale = gen_protos.stale_files(SRC, tmp_path)

    assert "v1/common_pb2.py" in written
    listing = "\n".join(f"  {item}" for item in stale)
    assert not stale, (
        f"The generated protobuf code under src/conductor_adapters/rpc/ is stale:\n{listing}\n"
        f"Run `{gen_protos.REGENERATE_COMMAND}` and commit the result."
    )


def test_generated_modules_import_and_round_trip_a_workflow() -> None:
    from conductor_adapters.rpc.v1 import (
        common_pb2,
        planner_pb2,
        planner_pb2_grpc,
        workflows_pb2,
        workflows_pb2_grpc,
    )

    # given: a finished workflow with one planner call and one step
    started = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    usage = common_pb2.Usage(prompt_tokens=12, completion_tokens=5, total_tokens=17)
    plan = common_pb2.Plan(
        steps=[
            common_pb2.PlanStep(model_id=1, subtask="Add 2 and 2."),
            common_pb2.PlanStep(
                model_id=0,
                subtask="Check the sum.",
                access_list=[common_pb2.AccessEntry(all=True), common_pb2.AccessEntry(step=0)],
            ),
        ]
    )
    call = common_pb2.PlannerCall(
        raw_output="model_id = [1, 0]",
        valid=True,
        plan=plan,
        pool=[
            common_pb2.PoolEntry(name="smollm2-local", description="tiny"),
            common_pb2.PoolEntry(name="conductor", description="re-plan", is_conductor=True),
        ],
        usage=usage,
        backend="llamacpp",
    )
    step = common_pb2.Step(
        index=0,
        kind=common_pb2.STEP_KIND_WORKER,
        worker="smollm2-local",
        subtask="Add 2 and 2.",
        status=common_pb2.STEP_STATUS_SUCCEEDED,
        output="4",
        usage=usage,
        attempts=[
            common_pb2.Attempt(number=1, status=common_pb2.ATTEMPT_STATUS_OK, status_code=200)
        ],
    )
    step.started_at.FromDatetime(started)
    step.attempts[0].started_at.FromDatetime(started)
    workflow = common_pb2.Workflow(
        id="0b7c3d0e-8f9a-4b1c-9d2e-3f4a5b6c7d8e",
        variant="conductor-ultra",
        question="What is 2 + 2?",
        status=common_pb2.WORKFLOW_STATUS_COMPLETED,
        planner_calls=[call],
        steps=[step],
        answer="4",
        cost_usd=0.0001,
        plan_valid=True,
    )
    workflow.created_at.FromDatetime(started)

    # when
    parsed = common_pb2.Workflow.FromString(workflow.SerializeToString())

    # then
    assert parsed == workflow
    assert parsed.steps[0].started_at.ToDatetime(tzinfo=UTC) == started
    assert parsed.planner_calls[0].plan.steps[1].access_list[0].WhichOneof("entry") == "all"
    assert parsed.HasField("answer")
    assert not parsed.HasField("error")
    assert not parsed.HasField("finished_at")
    assert not parsed.steps[0].attempts[0].HasField("error_class")

    event = workflows_pb2.WorkflowEvent(workflow_id=workflow.id, sequence=3, completed=workflow)
    assert workflows_pb2.WorkflowEvent.FromString(event.SerializeToString()) == event
    assert event.WhichOneof("payload") == "completed"
    response = planner_pb2.PlanResponse(call=call)
    assert planner_pb2.PlanResponse.FromString(response.SerializeToString()) == response

    assert common_pb2.DESCRIPTOR.name == "conductor/v1/common.proto"
    assert planner_pb2.DESCRIPTOR.services_by_name["Planner"].full_name == "conductor.v1.Planner"
    assert callable(planner_pb2_grpc.add_PlannerServicer_to_server)
    assert callable(workflows_pb2_grpc.add_WorkflowsServicer_to_server)
    assert hasattr(workflows_pb2_grpc.WorkflowsStub, "__init__")


def _copy_generated(destination: Path) -> None:
    for relative in gen_protos.generated_files(SRC):
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SRC / relative, target)


@pytest.mark.parametrize(
    ("change", "path", "reason"),
    [
        ("edit", "v1/workflows_pb2.py", "differs"),
        ("delete", "v1/common_pb2.pyi", "missing"),
        ("add", "v1/removed_pb2.py", "not generated from any .proto"),
    ],
)
def test_stale_comparison_reports_the_changed_file(
    tmp_path: Path, change: str, path: str, reason: str
) -> None:
    # given: a copy of the committed code with one file changed (the committed code is known fresh)
    _copy_generated(tmp_path)
    target = tmp_path / path
    if change == "edit":
        target.write_bytes(target.read_bytes() + b"# hand edit\n")
    elif change == "delete":
        target.unlink()
    else:
        target.write_text("# left over from a deleted .proto\n")

    stale = gen_protos.stale_files(tmp_path, SRC)

    assert stale == [gen_protos.StaleFile(path, reason)]


def test_check_command_fails_and_names_the_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _copy_generated(tmp_path)
    edited = tmp_path / "v1" / "planner_pb2_grpc.py"
    edited.write_bytes(edited.read_bytes().replace(b"Plan", b"Plot"))

    assert gen_protos.main(["--check", "--out", str(tmp_path)]) == 1

    message = capsys.readouterr().err
    assert "v1/planner_pb2_grpc.py (differs)" in message
    assert "python scripts/gen_protos.py" in message
    assert gen_protos.main(["--check", "--out", str(SRC)]) == 0

"""Generate the Python code of the gRPC protocol: protos/conductor/v1/ -> conductor_adapters.rpc.v1.

Why commit generated code and keep a script for it: installing or importing Conductor then needs
neither protoc nor grpcio-tools, gRPC users can read the typed stubs (``*_pb2.pyi``) next to the
code, and there is exactly one way to produce them. grpcio-tools is pinned in pyproject.toml, so a
fresh generation is byte-for-byte reproducible; ``--check`` (and tests/test_protos.py) use that to
fail when a .proto changed but the code was not regenerated.

Usage::

    python scripts/gen_protos.py            # regenerate the code under src/
    python scripts/gen_protos.py --check    # exit 1, listing stale files, if it is out of date
    python scripts/gen_protos.py --out DIR  # generate under DIR instead (e.g. for a test)

Every run regenerates all of protos/ and first removes the previously generated files, so the
code of a deleted .proto goes too. ``v1/__init__.py`` is kept by hand, not generated.

protoc names the Python modules after the proto files' import paths (``conductor/v1/x.proto``
imports ``from conductor.v1 import ...``), which would put the code in the domain package
``conductor``. The code lives with the other gRPC adapters instead: the proto namespace
directory (``conductor/``) is dropped from each generated path and imports between the generated
modules are made relative, so the package works wherever it sits.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import NamedTuple

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "protos"
DEFAULT_OUT = REPO_ROOT / "src" / "conductor_adapters" / "rpc"
# The first directory of every proto's import path: protoc's Python package root, dropped here.
PROTO_NAMESPACE = "conductor"
_GENERATED_IMPORT = re.compile(rb"^from " + PROTO_NAMESPACE.encode() + rb"\.(\w+) import ", re.M)
# What protoc writes for each x.proto: x_pb2.py (messages), x_pb2.pyi (their type stubs) and
# x_pb2_grpc.py (service stubs and servicers).
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
REGENERATE_COMMAND = "python scripts/gen_protos.py"


class GenerationError(RuntimeError):
    """protoc could not generate the code (its own messages are on stderr)."""


class StaleFile(NamedTuple):
    """A generated file whose committed copy does not match a fresh generation."""

    path: str  # relative to the output root, e.g. "v1/common_pb2.py"
    reason: str

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Every .proto under ``proto_root``, as paths relative to it (their import paths)."""
    return sorted(path.relative_to(proto_root) for path in proto_root.rglob("*.proto"))


def generated_files(out: Path, proto_root: Path = PROTO_ROOT) -> dict[str, bytes]:
    """The generated files under ``out``, by path relative to it, with their contents.

    Only the packages the protos live in are searched (``out/v1`` for ``protos/conductor/v1``),
    so hand-written code elsewhere under ``out`` is never touched.
    """
    found: dict[str, bytes] = {}
    for top in sorted({_python_path(proto).parts[0] for proto in proto_files(proto_root)}):
        package = out / top
        if not package.is_dir():
            continue
        for path in sorted(package.rglob("*")):
            if path.is_file() and path.name.endswith(GENERATED_SUFFIXES):
                found[path.relative_to(out).as_posix()] = path.read_bytes()
    return found


def generate(out: Path = DEFAULT_OUT, proto_root: Path = PROTO_ROOT) -> list[str]:
    """Run protoc over every .proto under ``proto_root``, writing the code under ``out``.

    Returns the generated files' paths relative to ``out``. Raises GenerationError when there
    are no protos or protoc rejects them.
    """
    protos = proto_files(proto_root)
    if not protos:
        raise GenerationError(f"no .proto files under {proto_root}")
    out.mkdir(parents=True, exist_ok=True)
    for stale in generated_files(out, proto_root):
        (out / stale).unlink()
    with tempfile.TemporaryDirectory(prefix="protoc-") as tmp:
        _run_protoc(Path(tmp), protos, proto_root)
        for generated in sorted(Path(tmp).rglob("*")):
            if not generated.is_file():
                continue
            relative = _python_path(generated.relative_to(tmp))
            target = out / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(_relative_imports(generated.read_bytes(), relative.parts[0]))
    return sorted(generated_files(out, proto_root))


def _python_path(proto_path: Path) -> Path:
    """Where the code of a proto-relative path goes: without the proto namespace directory."""
    if proto_path.parts[0] != PROTO_NAMESPACE or len(proto_path.parts) < 2:
        raise GenerationError(f"{proto_path}: protos must live under {PROTO_NAMESPACE}/")
    return Path(*proto_path.parts[1:])


def _relative_imports(code: bytes, package: str) -> bytes:
    """``from conductor.v1 import x_pb2`` becomes ``from . import x_pb2`` within v1 (and
    ``from ..v1 import`` from another version's package)."""

    def relative(match: re.Match[bytes]) -> bytes:
        target = match.group(1).decode()
        return f"from {'.' if target == package else '..' + target} import ".encode()

    return _GENERATED_IMPORT.sub(relative, code)


def _run_protoc(out: Path, protos: list[Path], proto_root: Path) -> None:
    # Imported here, not at the top: importing grpc_tools.protoc installs import hooks that
    # compile .proto files on import, which only a generation run should bring in.
    from grpc_tools import protoc  # type: ignore[import-untyped]

    with resources.as_file(resources.files("grpc_tools") / "_proto") as well_known_protos:
        # Absolute include paths and import-path file names keep the output independent of the
        # working directory: the generated code names files by import path only.
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known_protos}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *(proto.as_posix() for proto in protos),
        ]
        status = protoc.main(args)
    if status != 0:
        raise GenerationError(f"protoc failed with exit status {status} (see its messages above)")


def stale_files(committed: Path, fresh: Path, proto_root: Path = PROTO_ROOT) -> list[StaleFile]:
    """Compare the generated files under ``committed`` with a fresh generation under ``fresh``."""
    have = generated_files(committed, proto_root)
    want = generated_files(fresh, proto_root)
    stale = [
        StaleFile(path, "differs" if path in have else "missing")
        for path, content in want.items()
        if have.get(path) != content
    ]
    stale += [StaleFile(path, "not generated from any .proto") for path in have if path not in want]
    return sorted(stale)


def check(out: Path = DEFAULT_OUT, proto_root: Path = PROTO_ROOT) -> list[StaleFile]:
    """Generate into a temporary directory and list the files under ``out`` that are stale."""
    with tempfile.TemporaryDirectory(prefix="gen_protos-") as tmp:
        generate(Path(tmp), proto_root)
        return stale_files(out, Path(tmp), proto_root)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help="root to write the code under (default: src/conductor_adapters/rpc/)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="generate into a temporary directory and exit 1 if the code under --out differs",
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    try:
        if args.check:
            stale = check(out)
            if stale:
                listing = "\n".join(f"  {item}" for item in stale)
                print(
                    f"Generated protobuf code under {out} is stale:\n{listing}\n"
                    f"Regenerate it with: {REGENERATE_COMMAND}",
                    file=sys.stderr,
                )
                return 1
            print(f"Generated protobuf code under {out} is up to date.")
            return 0
        written = generate(out)
    except GenerationError as exc:
        print(f"gen_protos: {exc}", file=sys.stderr)
        return 2
    print(f"Wrote {len(written)} files under {out}:")
    for path in written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

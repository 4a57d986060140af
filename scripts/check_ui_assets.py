"""Check that the built trace viewer (services/api/conductor_api/ui/static) was built from the
sources in ui/ as they are now, without Node: the digest `npm run build` wrote into
build-info.json is computed again here (the same way as ui/scripts/build-info.mjs) and
compared; the scripts and styles index.html loads must be there too.

Usage: python scripts/check_ui_assets.py   (exit 1, with what to run, when they differ)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UI = ROOT / "ui"
STATIC = ROOT / "services" / "api" / "conductor_api" / "ui" / "static"
SKIPPED = {"node_modules", "dist"}
REBUILD = "run `npm ci && npm run build` in ui/ and commit services/api/conductor_api/ui/static"


def source_files(ui: Path) -> list[str]:
    """Every regular file under ``ui`` but node_modules and dist, as "/" paths relative to it,
    sorted by their UTF-8 bytes."""
    found: list[str] = []

    def walk(folder: Path) -> None:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in SKIPPED:
                        walk(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    found.append(Path(entry.path).relative_to(ui).as_posix())

    walk(ui)
    return sorted(found, key=lambda path: path.encode())


def sources_digest(ui: Path) -> tuple[str, int]:
    """SHA-256 over `<path>\\0<sha256 of the content, CRLF read as LF>\\n` per source file."""
    digest = hashlib.sha256()
    files = source_files(ui)
    for path in files:
        content = (ui / path).read_bytes().replace(b"\r\n", b"\n")
        digest.update(f"{path}\0{hashlib.sha256(content).hexdigest()}\n".encode())
    return digest.hexdigest(), len(files)


def problems(ui: Path = UI, static: Path = STATIC) -> list[str]:
    if not ui.is_dir():
        return [f"{ui} is missing: the viewer's sources are not in this checkout"]
    info_path = static / "build-info.json"
    index = static / "index.html"
    if not info_path.is_file() or not index.is_file():
        return [f"the viewer is not built ({info_path.relative_to(ROOT)} is missing): {REBUILD}"]
    found: list[str] = []
    built = json.loads(info_path.read_text()).get("sources_sha256")
    now, count = sources_digest(ui)
    if built != now:
        found.append(
            f"ui/ changed since the viewer was built ({count} source files hash to {now[:12]}, "
            f"the build was made from {str(built)[:12]}): {REBUILD}"
        )
    for asset in re.findall(r"""(?:src|href)="/ui/(assets/[^"]+)\"""", index.read_text()):
        if not (static / asset).is_file():
            found.append(f"index.html loads {asset}, which is missing: {REBUILD}")
    return found


def main() -> int:
    found = problems()
    for problem in found:
        print(f"check_ui_assets: {problem}", file=sys.stderr)
    if not found:
        print("check_ui_assets: the built viewer matches ui/")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

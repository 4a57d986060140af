"""The web trace viewer under ``/ui``: the static files ``ui/`` builds (``npm run build``) into
``conductor_api/ui/static``, shipped with the package so that serving it needs no Node.

The pages need no key (they hold no data); the viewer calls the JSON API with the key its user
types. Every answer under /ui carries a strict Content-Security-Policy: the bundle has no
inline script or style and never evaluates strings, so nothing needs 'unsafe-inline' or
'unsafe-eval'.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, PlainTextResponse, Response

STATIC = Path(__file__).parent / "ui" / "static"

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# Vite names built assets NAME-HASH.EXT (8 characters of hash): their content never changes
# under that name, so browsers may keep them for a year; anything else is revalidated.
_HASHED = re.compile(r"^[\w.-]+-[A-Za-z0-9_-]{8}\.[a-z0-9]+$")
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
# Set here rather than guessed: mimetypes reads the host's tables, which differ (and some
# map .js to text/plain, which browsers refuse for modules under nosniff).
_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".gif": "image/gif",
    ".html": "text/html; charset=utf-8",
    ".ico": "image/x-icon",
    ".jpg": "image/jpeg",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".mjs": "text/javascript; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
    ".webp": "image/webp",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
}
NOT_BUILT = (
    "The trace viewer is not built: run `npm ci && npm run build` in ui/ (it writes "
    "services/api/conductor_api/ui/static/, which the package ships).\n"
)

router = APIRouter(prefix="/ui", include_in_schema=False)


def _text(status: int, body: str) -> Response:
    return PlainTextResponse(body, status_code=status, headers=SECURITY_HEADERS)


def index_response(static: Path) -> Response:
    index = static / "index.html"
    if not index.is_file():
        return _text(503, NOT_BUILT)
    return FileResponse(
        index,
        media_type=_TYPES[".html"],
        headers={**SECURITY_HEADERS, "Cache-Control": REVALIDATE},
    )


def asset_path(static: Path, path: str) -> Path | None:
    """The file ``path`` names under ``static/assets``; None when it names nothing there (a
    missing file, a folder, or a way out of the folder: "..", an absolute path, a link)."""
    assets = (static / "assets").resolve()
    if not path or "\\" in path or "\x00" in path:
        return None
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    candidate = assets.joinpath(*parts)
    try:
        resolved = candidate.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not resolved.is_relative_to(assets) or not resolved.is_file():
        return None
    return resolved


@router.get("")
async def index() -> Response:
    """The viewer's page (its routes are in the URL's hash: #/, #/workflows/ID, #/summary)."""
    return index_response(STATIC)


@router.get("/")
async def index_slash() -> Response:
    return index_response(STATIC)


@router.get("/assets/{path:path}")
async def asset(path: str) -> Response:
    """A built script, stylesheet or image; hashed names are cached for good."""
    if not (STATIC / "index.html").is_file():
        return _text(503, NOT_BUILT)
    found = asset_path(STATIC, path)
    if found is None:
        return _text(404, "no such asset\n")
    cache = IMMUTABLE if _HASHED.match(found.name) else REVALIDATE
    return FileResponse(
        found,
        media_type=_TYPES.get(found.suffix.lower(), "application/octet-stream"),
        headers={**SECURITY_HEADERS, "Cache-Control": cache},
    )


@router.get("/{path:path}")
async def elsewhere(path: str) -> Response:
    """Anything else under /ui: a 404 that carries the same headers."""
    return _text(404, "not found: the viewer's pages are at /ui/ (routes after #)\n")

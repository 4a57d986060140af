"""The trace viewer's files under /ui: its page and built assets with a strict CSP on every
answer, nothing outside its folder, and a clear 503 when the viewer was never built."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from conductor_api.ui import CONTENT_SECURITY_POLICY, STATIC, asset_path, index_response

from fakes.api_fixture import Api


def _assets() -> list[str]:
    return sorted(p.name for p in (STATIC / "assets").iterdir())


def test_the_page_and_its_assets_come_with_a_strict_policy(api: Api) -> None:
    with httpx.Client(base_url=api.url) as http:
        page = http.get("/ui/")
        script = http.get(f"/ui/assets/{next(a for a in _assets() if a.endswith('.js'))}")

    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    assert "'unsafe-eval'" not in CONTENT_SECURITY_POLICY
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in page.text  # no inline script: the policy would refuse it
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert "immutable" in script.headers["cache-control"]


@pytest.mark.parametrize(
    "path",
    [
        "/ui/assets/%2e%2e/%2e%2e/app.py",
        "/ui/assets/..%2F..%2Fapp.py",
        "/ui/assets/",
        "/ui/assets/nothing.js",
        "/ui/elsewhere",
    ],
)
def test_nothing_outside_the_built_assets_is_served(api: Api, path: str) -> None:
    # (a literal "../" never reaches the server: clients resolve it; encoded ones do)
    with httpx.Client(base_url=api.url) as http:
        reply = http.get(path)
    assert reply.status_code == 404, reply.text
    assert reply.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


def test_an_asset_path_never_leaves_the_assets_folder(tmp_path: Path) -> None:
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "a.js").write_text("1")
    (tmp_path / "secret.txt").write_text("no")
    (tmp_path / "assets" / "link.js").symlink_to(tmp_path / "secret.txt")

    assert asset_path(tmp_path, "a.js") == (tmp_path / "assets" / "a.js").resolve()
    for path in ("../secret.txt", "/etc/passwd", "link.js", "", "a.js\x00", "..\\secret.txt"):
        assert asset_path(tmp_path, path) is None, path


def test_a_viewer_never_built_says_how_to_build_it(tmp_path: Path) -> None:
    reply = index_response(tmp_path)
    assert reply.status_code == 503
    assert b"npm ci && npm run build" in bytes(reply.body)

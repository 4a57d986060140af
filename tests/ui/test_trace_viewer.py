"""The trace viewer (/ui) in a real browser: Debian's chromium, driven by Playwright, against
the real server over workflows the scripted Conductor wrote on fake workers.

It checks what a user sees: the list and its filters, a workflow's graph (one node per step,
one edge per step it could see, read from the DOM), a running workflow's page following its
events, another tenant's workflow as not found, a model's ``<script>`` shown as text and never
run, and axe-core's accessibility rules (no serious or critical violation). Each page is
written to docs/ui/ as a screenshot, which the README shows.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, Page, expect, sync_playwright

from conductor.errors import WorkerUnavailable
from conductor.pool import Price
from conductor_adapters.store.keys import create_key

from fakes.api_server import LiveApi, scripted_service
from fakes.scripted import ScriptedWorker

pytestmark = [pytest.mark.processes, pytest.mark.browser]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "ui"
SLOW_S = 2.0  # the slow worker's call: long enough to open its workflow's page meanwhile
HOSTILE = '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'


def _hostile(messages: list[Any]) -> str:
    return f"Here: {HOSTILE}"


def _answer(name: str) -> Any:
    return lambda messages: f"{name} answers {len(messages)} message(s)"


WORKERS = [
    ScriptedWorker("alpha", answer=_answer("alpha")),
    ScriptedWorker("beta", answer=_answer("beta")),
    ScriptedWorker("slowpoke", delay_s=SLOW_S, answer=_answer("slowpoke")),
    ScriptedWorker("hostile", answer=_hostile),
    ScriptedWorker("down", fail_with=WorkerUnavailable("down is down")),
]
PRICE = Price(input=2.5, output=10.0)  # USD per million tokens: the pages show costs


class Viewer:
    """The server, its tenants' keys, and the workflows they ran."""

    def __init__(self, server: LiveApi) -> None:
        self.server = server
        engine = server.service.engine
        self.key = create_key(engine, "acme").secret
        self.other_key = create_key(engine, "globex").secret
        self.ids: dict[str, str] = {}

    @property
    def url(self) -> str:
        return self.server.url

    def http(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key or self.key}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def submit(self, name: str, key: str | None = None, **job: Any) -> str:
        with self.http(key) as http:
            reply = http.post("/v1/workflows", json={"question": "What is 6 * 7?", **job})
            assert reply.status_code == 202, reply.text
        self.ids[name] = str(reply.json()["id"])
        return self.ids[name]

    def workflow(self, workflow_id: str, key: str | None = None) -> dict[str, Any]:
        with self.http(key) as http:
            reply = http.get(f"/v1/workflows/{workflow_id}")
            assert reply.status_code == 200, reply.text
            return dict(reply.json())

    def wait_ended(self, workflow_id: str, key: str | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            view = self.workflow(workflow_id, key)
            if view["status"] in ("completed", "failed", "cancelled"):
                return view
            time.sleep(0.05)
        raise AssertionError(f"workflow {workflow_id} did not end")


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    database = tmp_path_factory.mktemp("ui") / "conductor.db"
    server = LiveApi(lambda: scripted_service(f"sqlite:///{database}", WORKERS, price=PRICE))
    try:
        made = Viewer(server)
        made.submit("two-step", pool=["alpha", "beta"], metadata={"team": "search"})
        made.submit("one-step", pool=["beta"], variant="conductor-mini")
        made.submit("hostile", question=f"Show me {HOSTILE}", pool=["hostile"])
        made.submit("failed", pool=["down"])
        made.submit("theirs", made.other_key, pool=["alpha"])
        for name, workflow_id in made.ids.items():
            made.wait_ended(workflow_id, made.other_key if name == "theirs" else None)
        yield made
    finally:
        server.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail(
            "Debian's chromium is not installed (apt-get install chromium): the trace viewer "
            "is tested in a real browser"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, viewer: Viewer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert errors == [], f"the page raised: {errors}"


def _sign_in(page: Page, viewer: Viewer, key: str | None = None, route: str = "") -> None:
    page.goto(f"{viewer.url}/ui/#/{route}")
    page.fill("#api-key", key or viewer.key)
    page.locator("#login-form button[type=submit]").click()
    expect(page.locator("#sign-out")).to_be_visible()


def _serious(page: Page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is."""
    results = Axe().run(page)
    return [
        f"{v['id']} ({v['impact']}): {v['help']}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def _shoot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_the_list_shows_the_tenants_workflows_and_its_filters_narrow_it(
    page: Page, viewer: Viewer
) -> None:
    # Given a signed-in user of tenant acme
    _sign_in(page, viewer)
    rows = page.locator("#workflow-table tr[data-workflow-id]")

    # Then the list shows acme's workflows and not globex's
    expect(rows).to_have_count(4)
    shown = {rows.nth(i).get_attribute("data-workflow-id") for i in range(4)}
    assert viewer.ids["theirs"] not in shown
    assert shown == {viewer.ids[n] for n in ("two-step", "one-step", "hostile", "failed")}
    two_step = page.locator(f'tr[data-workflow-id="{viewer.ids["two-step"]}"] td')
    expect(two_step.nth(3)).to_have_text("2")  # its steps
    assert _serious(page) == []
    _shoot(page, "list")

    # When they filter by status, by variant, then search the questions
    page.select_option("#filter-status", "failed")
    page.get_by_role("button", name="Apply").click()
    expect(rows.first).to_have_attribute("data-workflow-id", viewer.ids["failed"])
    expect(rows).to_have_count(1)
    page.select_option("#filter-status", "")
    page.fill("#filter-variant", "conductor-mini")
    page.get_by_role("button", name="Apply").click()
    expect(rows.first).to_have_attribute("data-workflow-id", viewer.ids["one-step"])
    expect(rows).to_have_count(1)
    page.fill("#filter-variant", "")
    page.fill("#filter-q", "show me")
    page.get_by_role("button", name="Apply").click()
    expect(rows.first).to_have_attribute("data-workflow-id", viewer.ids["hostile"])
    expect(rows).to_have_count(1)


def test_a_workflow_page_draws_a_node_per_step_and_an_edge_per_access(
    page: Page, viewer: Viewer
) -> None:
    workflow = viewer.workflow(viewer.ids["two-step"])
    _sign_in(page, viewer, route=f"workflows/{workflow['id']}")

    nodes = page.locator("#plan-graph g.step-node")
    expect(nodes).to_have_count(len(workflow["steps"]))
    drawn = {
        (int(edge.get_attribute("data-from") or -1), int(edge.get_attribute("data-to") or -1))
        for edge in page.locator("#plan-graph path.access-edge").all()
    }
    seen = {(j, s["index"]) for s in workflow["steps"] for j in s["visible_steps"]}
    assert drawn == seen
    assert len(page.locator("#plan-graph path.access-edge").all()) == len(seen)
    workers = [nodes.nth(i).get_attribute("data-worker") for i in range(nodes.count())]
    assert workers == [s["worker"] for s in workflow["steps"]]
    expect(page.locator("#planner-calls article.planner-call")).to_have_count(
        len(workflow["planner_calls"])
    )
    assert _serious(page) == []
    _shoot(page, "workflow")


def test_a_running_workflows_page_follows_it_without_a_reload(page: Page, viewer: Viewer) -> None:
    # Given a workflow whose first step takes two seconds, its page open while it runs
    workflow_id = viewer.submit("live", pool=["slowpoke", "beta"])
    _sign_in(page, viewer, route=f"workflows/{workflow_id}")
    page.evaluate("window.__sameDocument = true")
    expect(page.locator("#workflow-header")).to_contain_text("running")

    # When its steps end, the page shows it: the first step succeeded, then the workflow
    first = page.locator('#plan-graph g.step-node[data-step="0"]')
    expect(first).to_have_attribute("data-status", "succeeded", timeout=15_000)
    expect(page.locator("#workflow-header")).to_contain_text("completed", timeout=15_000)

    # Then it was the same document all along (no reload)
    assert page.evaluate("window.__sameDocument") is True


def test_another_tenants_workflow_is_not_found(page: Page, viewer: Viewer) -> None:
    _sign_in(page, viewer, route=f"workflows/{viewer.ids['theirs']}")
    expect(page.locator("#not-found")).to_be_visible()
    assert page.locator("#plan-graph g.step-node").count() == 0


def test_a_models_script_is_shown_as_text_and_never_runs(page: Page, viewer: Viewer) -> None:
    workflow_id = viewer.ids["hostile"]
    _sign_in(page, viewer, route=f"workflows/{workflow_id}")
    page.locator('#plan-graph g.step-node[data-step="0"]').click()

    expect(page.locator("#step-detail")).to_contain_text(HOSTILE)
    expect(page.locator("#workflow-header")).to_contain_text("<script>")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#step-detail script, #workflow-header script").count() == 0
    assert page.locator("#step-detail img, #workflow-header img").count() == 0


def test_the_summary_page_charts_the_tenants_workflows(page: Page, viewer: Viewer) -> None:
    _sign_in(page, viewer, route="summary")

    expect(page.locator("#summary-totals")).to_contain_text("Workflows")
    expect(page.locator("#chart-workflows")).to_be_visible()
    expect(page.locator("#chart-worker-tokens")).to_be_visible()
    assert _serious(page) == []
    _shoot(page, "summary")


def test_the_sign_in_page_is_accessible_and_refuses_a_wrong_key(page: Page, viewer: Viewer) -> None:
    page.goto(f"{viewer.url}/ui/")
    expect(page.locator("#login-form")).to_be_visible()
    assert _serious(page) == []

    page.fill("#api-key", viewer.key[:-4] + "zzzz")
    page.locator("#login-form button[type=submit]").click()
    expect(page.locator("#login-message")).not_to_be_empty()
    expect(page.locator("#sign-out")).to_be_hidden()


def test_feedback_given_on_a_workflows_page_is_stored(page: Page, viewer: Viewer) -> None:
    workflow_id = viewer.ids["one-step"]
    _sign_in(page, viewer, route=f"workflows/{workflow_id}")

    page.fill("#feedback-score", "0.8")
    page.locator("#feedback-form button[type=submit]").click()

    expect(page.locator("#feedback-stored")).to_contain_text("0.8")
    assert viewer.workflow(workflow_id)["feedback"] == 0.8

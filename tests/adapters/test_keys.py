"""API keys: shown once, stored hashed, one tenant each, refused once revoked."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from conductor.errors import InvalidRequest
from conductor_adapters.store.db import upgrade
from conductor_adapters.store.keys import (
    CachedKeys,
    any_key_exists,
    authenticate,
    create_key,
    list_keys,
    revoke_key,
)
from conductor_adapters.store.models import api_key_table


def test_a_key_authenticates_as_its_tenant_and_is_stored_only_as_a_hash(engine: Engine) -> None:
    made = create_key(engine, "acme", name="ci", allowed_pool=["alpha"])

    key = authenticate(engine, made.secret)

    assert key is not None
    assert (key.tenant, key.name, key.allowed_pool) == ("acme", "ci", ["alpha"])
    with engine.connect() as conn:
        stored = [tuple(row) for row in conn.execute(select(api_key_table))]
    assert made.secret.split("_", 2)[2] not in repr(stored)
    assert any_key_exists(engine)


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "cnd_",
        "Bearer something",
        "cnd_000000000000_" + "A" * 43,  # well-formed, unknown id
    ],
)
def test_malformed_and_unknown_keys_are_refused(engine: Engine, presented: str) -> None:
    create_key(engine, "acme")
    assert authenticate(engine, presented) is None


def test_a_wrong_secret_or_a_revoked_key_is_refused(engine: Engine) -> None:
    made = create_key(engine, "acme")
    prefix, key_id, secret = made.secret.split("_", 2)
    wrong = f"{prefix}_{key_id}_{'B' if secret[0] != 'B' else 'C'}{secret[1:]}"

    assert authenticate(engine, wrong) is None
    assert revoke_key(engine, key_id)
    assert authenticate(engine, made.secret) is None
    assert not revoke_key(engine, key_id)  # already revoked
    assert not any_key_exists(engine)


def test_keys_list_by_tenant_without_secrets(engine: Engine) -> None:
    create_key(engine, "acme")
    create_key(engine, "globex")

    assert [k.tenant for k in list_keys(engine, "acme")] == ["acme"]
    assert len(list_keys(engine)) == 2


@pytest.mark.parametrize(
    ("tenant", "pool", "message"),
    [
        ("Acme Corp", None, "tenant 'Acme Corp'"),
        ("acme", [], "at least one worker"),
        ("acme", ["alpha", "nope"], "workers not in the pool: nope"),
    ],
)
def test_bad_keys_are_refused_clearly(
    engine: Engine, tenant: str, pool: list[str] | None, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        create_key(engine, tenant, allowed_pool=pool, known_workers={"alpha"})


@pytest.mark.processes
def test_the_cli_prints_the_key_once_and_lists_it_without_the_secret(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    upgrade(url)
    env = {**os.environ, "CONDUCTOR_DATABASE_URL": url}
    env.pop("CONDUCTOR_POOL_FILE", None)
    cli = [sys.executable, "-c", "from conductor_cli import main; main()", "keys"]

    made = subprocess.run(
        [*cli, "create", "--tenant", "acme", "--pool", "smollm2-local"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    listed = subprocess.run([*cli, "list"], capture_output=True, text=True, env=env, check=True)
    refused = subprocess.run(
        [*cli, "create", "--tenant", "acme", "--pool", "gpt-9"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )

    secret = made.stdout.strip()
    assert secret.startswith("cnd_")
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (row["tenant"], row["allowed_pool"]) == ("acme", ["smollm2-local"])
    assert secret.split("_", 2)[2] not in listed.stdout
    assert refused.returncode == 2
    assert "workers not in the pool: gpt-9" in refused.stderr


async def test_a_server_reuses_a_key_check_for_its_time_to_live_only(engine: Engine) -> None:
    keys = CachedKeys(engine, ttl_s=0.3)
    assert not await keys.any_key_exists()
    made = create_key(engine, "acme")

    assert not await keys.any_key_exists()  # the open answer, reused
    found = await keys.authenticate(made.secret)  # a key made a moment ago works at once
    assert found is not None
    assert found.tenant == "acme"
    assert revoke_key(engine, found.id)
    assert await keys.authenticate(made.secret) == found  # the live answer, reused
    create_key(engine, "globex")

    await asyncio.sleep(0.3)
    assert await keys.authenticate(made.secret) is None
    assert await keys.any_key_exists()
    assert await keys.authenticate("cnd_000000000000_" + "A" * 43) is None

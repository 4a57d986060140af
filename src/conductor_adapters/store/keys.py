"""API keys: each belongs to one tenant and may be limited to some workers of the pool.

A key reads ``cnd_<id>_<secret>``. The id is public (it names the key in listings and logs);
the secret is 32 random bytes, shown once when the key is made and stored only as its SHA-256.
A fast hash fits here, unlike for passwords: the secret is random and long, so there is
nothing to guess, and checking a key on every request must stay cheap. Comparison is constant
time, and a revoked or unknown key is refused the same way as a wrong secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import Engine, insert, select, update

from conductor.errors import InvalidRequest
from conductor_adapters.store.models import api_key_table, direct_call_table

KEY_PREFIX = "cnd"
_TENANT = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_KEY = re.compile(rf"{KEY_PREFIX}_([0-9a-f]{{12}})_([A-Za-z0-9_-]{{43}})")


BudgetPeriod = Literal["day", "month"]


class KeyLimits(BaseModel):
    """What a key may spend; None: no limit. Every API replica enforces the same limits."""

    model_config = ConfigDict(extra="forbid")

    rpm_limit: int | None = Field(default=None, ge=1, description="Requests per minute.")
    tpm_limit: int | None = Field(
        default=None, ge=1, description="Tokens per minute, of the workflows that ended."
    )
    max_concurrent: int | None = Field(
        default=None, ge=1, description="Workflows queued or running at once."
    )
    budget_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    budget_period: BudgetPeriod | None = None

    @model_validator(mode="after")
    def _budget_has_a_period(self) -> KeyLimits:
        if (self.budget_usd is None) != (self.budget_period is None):
            raise ValueError("a budget needs its period (day or month), and a period its budget")
        return self


class ApiKey(KeyLimits):
    """A key as the system knows it, with its limits; never its secret."""

    model_config = ConfigDict(extra="ignore")

    id: str
    tenant: str
    name: str
    allowed_pool: list[str] | None
    created_at: datetime
    revoked_at: datetime | None = None
    # Where its jobs' outcomes go by default, and whether it can sign them (its signing secret
    # itself is never part of a key as read: only `set_webhook` returns it, once).
    webhook_url: str | None = None
    signs_webhooks: bool = False

    @model_validator(mode="before")
    @classmethod
    def _secret_is_only_known_to_exist(cls, data: Any) -> Any:
        if isinstance(data, dict) and "webhook_secret" in data:
            data = {**data, "signs_webhooks": bool(data["webhook_secret"])}
            del data["webhook_secret"]
        return data

    @property
    def limits(self) -> KeyLimits:
        return KeyLimits(**self.model_dump(include=set(KeyLimits.model_fields)))


class NewKey(BaseModel):
    key: ApiKey
    secret: str  # the whole key, to hand to the client once


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_tenant(tenant: str) -> str:
    if not _TENANT.fullmatch(tenant):
        raise InvalidRequest(
            f"tenant {tenant!r}: use 1 to 63 lowercase letters, digits, '-' or '_', starting "
            "with a letter or digit"
        )
    return tenant


def create_key(
    engine: Engine,
    tenant: str,
    *,
    name: str = "",
    allowed_pool: list[str] | None = None,
    known_workers: set[str] | None = None,
    limits: KeyLimits | None = None,
) -> NewKey:
    """Make a key; ``known_workers`` (the pool) refuses allowed workers it does not have."""
    check_tenant(tenant)
    if allowed_pool is not None:
        if not allowed_pool:
            raise InvalidRequest("an allowed pool must name at least one worker")
        unknown = sorted(set(allowed_pool) - (known_workers or set(allowed_pool)))
        if unknown:
            raise InvalidRequest(f"workers not in the pool: {', '.join(unknown)}")
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    key = ApiKey(
        id=key_id,
        tenant=tenant,
        name=name,
        allowed_pool=allowed_pool,
        created_at=datetime.now(UTC),
        **(limits or KeyLimits()).model_dump(),
    )
    with engine.begin() as conn:
        conn.execute(
            insert(api_key_table).values(
                **key.model_dump(exclude={"revoked_at", "signs_webhooks"}),
                secret_sha256=_digest(secret),
            )
        )
    return NewKey(key=key, secret=f"{KEY_PREFIX}_{key_id}_{secret}")


def set_limits(engine: Engine, key_id: str, limits: KeyLimits) -> ApiKey:
    """Replace a key's limits (servers see them within ``KEY_CACHE_S``)."""
    with engine.begin() as conn:
        done = conn.execute(
            update(api_key_table)
            .where(api_key_table.c.id == key_id, api_key_table.c.revoked_at.is_(None))
            .values(**limits.model_dump())
        )
        if not done.rowcount:
            raise InvalidRequest(f"no live key {key_id!r}")
        row = conn.execute(select(api_key_table).where(api_key_table.c.id == key_id)).mappings()
        return ApiKey.model_validate(dict(row.one()))


def set_webhook(
    engine: Engine, key_id: str, url: str | None, *, new_secret: bool = False
) -> tuple[ApiKey, str | None]:
    """Set a key's default webhook URL (None: jobs name theirs); make its signing secret when
    it has none, or a new one when asked. Returns the key and the secret when one was made."""
    from conductor_adapters.webhooks import check_url
    from conductor_adapters.webhooks import new_secret as make_secret

    with engine.begin() as conn:
        row = conn.execute(
            select(api_key_table.c.webhook_secret).where(
                api_key_table.c.id == key_id, api_key_table.c.revoked_at.is_(None)
            )
        ).first()
        if row is None:
            raise InvalidRequest(f"no live key {key_id!r}")
        if url is not None:
            check_url(url, "--url")
        secret = make_secret() if new_secret or not row.webhook_secret else None
        values: dict[str, Any] = {"webhook_url": url}
        if secret is not None:
            values["webhook_secret"] = secret
        conn.execute(update(api_key_table).where(api_key_table.c.id == key_id).values(**values))
        made = conn.execute(select(api_key_table).where(api_key_table.c.id == key_id)).mappings()
        return ApiKey.model_validate(dict(made.one())), secret


def authenticate(engine: Engine, presented: str) -> ApiKey | None:
    """The key ``presented`` is, if it is a live one; None otherwise (whatever the reason)."""
    match = _KEY.fullmatch(presented.strip())
    if match is None:
        return None
    key_id, secret = match.groups()
    with engine.connect() as conn:
        row = (
            conn.execute(select(api_key_table).where(api_key_table.c.id == key_id))
            .mappings()
            .one_or_none()
        )
    if row is None or row["revoked_at"] is not None:
        return None
    if not hmac.compare_digest(row["secret_sha256"], _digest(secret)):
        return None
    return ApiKey.model_validate(dict(row))


def list_keys(engine: Engine, tenant: str | None = None) -> list[ApiKey]:
    query = select(api_key_table).order_by(api_key_table.c.created_at)
    if tenant is not None:
        query = query.where(api_key_table.c.tenant == tenant)
    with engine.connect() as conn:
        return [ApiKey.model_validate(dict(row)) for row in conn.execute(query).mappings()]


def revoke_key(engine: Engine, key_id: str) -> bool:
    """Revoke a key by id; False when no live key has that id."""
    with engine.begin() as conn:
        done = conn.execute(
            update(api_key_table)
            .where(api_key_table.c.id == key_id)
            .where(api_key_table.c.revoked_at.is_(None))
            .values(revoked_at=datetime.now(UTC))
        )
    return bool(done.rowcount)


def any_key_exists(engine: Engine) -> bool:
    """Whether any live key exists: an embedded server runs open only while none does."""
    with engine.connect() as conn:
        query = select(api_key_table.c.id).where(api_key_table.c.revoked_at.is_(None)).limit(1)
        return conn.execute(query).first() is not None


# How long an answer of the key table is reused: a revoked key is refused, and the first key
# made closes an open server, within this long. Asking the database on every request cost a
# query and a thread hop each, a tenth of a pass-through call's CPU.
KEY_CACHE_S = 1.0
KEYS_CACHED = 10_000


class CachedKeys:
    """``authenticate`` and ``any_key_exists`` for a server, each answer reused for ``ttl_s``.

    Only live keys are remembered: an unknown or wrong one is checked against the database every
    time, so a flood of made-up keys cannot fill memory, and a key made a moment ago works at
    once.
    """

    def __init__(self, engine: Engine, *, ttl_s: float = KEY_CACHE_S) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self._live: OrderedDict[str, tuple[float, ApiKey]] = OrderedDict()
        self._any: tuple[float, bool] | None = None

    async def authenticate(self, presented: str) -> ApiKey | None:
        now = time.monotonic()
        cached = self._live.get(presented)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        key = await asyncio.to_thread(authenticate, self.engine, presented)
        self._live.pop(presented, None)
        if key is not None:
            self._live[presented] = (now, key)
            while len(self._live) > KEYS_CACHED:
                self._live.popitem(last=False)
        return key

    async def any_key_exists(self) -> bool:
        now = time.monotonic()
        if self._any is not None and now - self._any[0] < self.ttl_s:
            return self._any[1]
        exists = await asyncio.to_thread(any_key_exists, self.engine)
        self._any = (now, exists)
        return exists


def record_direct_call(
    engine: Engine, key_id: str, worker: str, total_tokens: int, cost_usd: float
) -> None:
    """What a worker called directly by ``key_id`` spent (every attempt, failed ones too): it
    counts against the key's tokens per minute and budget beside its workflows."""
    with engine.begin() as conn:
        conn.execute(
            insert(direct_call_table).values(
                key_id=key_id,
                worker=worker,
                at=datetime.now(UTC),
                total_tokens=total_tokens,
                cost_usd=cost_usd,
            )
        )

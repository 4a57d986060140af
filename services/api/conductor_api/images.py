"""Images in requests: read from Chat Completions' ``image_url`` parts (the Responses API's
``input_image`` parts are stored in that form), and passed to a worker called directly whose
provider takes them (``IMAGE_PROVIDERS``). A workflow's Conductor and steps read text, so a
workflow refuses images; so does a worker whose provider takes none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from conductor.chat import ImagePart
from conductor.pool import IMAGE_PROVIDERS, Provider, WorkerSpec
from conductor_api.errors import invalid, unsupported
from conductor_api.schemas import ChatMessageIn

IMAGE_PART = "image_url"
IMAGE_WORKERS = ", ".join(sorted(p.value for p in IMAGE_PROVIDERS))
_DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,")


def image_part(raw: Any, param: str) -> ImagePart:
    """An ``image_url`` part's image: ``{"url", "detail"}`` or the URL alone."""
    spec = raw if isinstance(raw, Mapping) else {"url": raw}
    url = spec.get("url")
    if not isinstance(url, str) or not (
        url.startswith(("http://", "https://")) or _DATA_URL.match(url)
    ):
        raise invalid(
            param, "expected an http(s) URL or a data:image/...;base64,... URL of the image"
        )
    try:
        return ImagePart(url=url, detail=spec.get("detail"))
    except ValidationError as exc:
        raise invalid(param, exc.errors()[0]["msg"]) from None


def message_images(message: ChatMessageIn, index: int) -> tuple[ImagePart, ...]:
    """The images of a message's content parts, in order; only a user message may show any."""
    if not isinstance(message.content, list):
        return ()
    images = []
    for j, part in enumerate(message.content):
        if part.type != IMAGE_PART:
            continue
        param = f"messages[{index}].content[{j}]"
        if message.role != "user":
            raise unsupported(param, "images go in user messages")
        images.append(image_part((part.model_extra or {}).get(IMAGE_PART), param))
    return tuple(images)


def image_params(messages: list[ChatMessageIn]) -> list[str]:
    """Where the messages carry images, as ``messages[i].content[j]``."""
    return [
        f"messages[{i}].content[{j}]"
        for i, message in enumerate(messages)
        if isinstance(message.content, list)
        for j, part in enumerate(message.content)
        if part.type == IMAGE_PART
    ]


def _linked(messages: list[ChatMessageIn]) -> str | None:
    """Where the first image given by an http(s) URL is, if any."""
    for i, message in enumerate(messages):
        for j, part in enumerate(message.content if isinstance(message.content, list) else []):
            raw = (part.model_extra or {}).get(IMAGE_PART) if part.type == IMAGE_PART else None
            url = raw.get("url") if isinstance(raw, Mapping) else raw
            if isinstance(url, str) and url.startswith(("http://", "https://")):
                return f"messages[{i}].content[{j}]"
    return None


def check_images(
    spec: WorkerSpec | None, messages: list[ChatMessageIn], param: str | None = None
) -> None:
    """Images go to a worker called directly (``spec``) whose provider takes them; for a
    workflow (``spec`` None) or another worker, a 400 naming the first image (or ``param``).
    A self-hosted OpenAI-compatible server fetches a linked image from inside the operator's
    network, so it takes images inline only: a client cannot make it reach internal hosts."""
    found = image_params(messages)
    if found and spec is not None and spec.provider is Provider.OPENAI_COMPATIBLE:
        linked = _linked(messages)
        if linked is not None:
            raise unsupported(
                param or linked,
                f"worker {spec.name!r} is self-hosted and would fetch the image from inside "
                "the network: send it inline, as a data:image/...;base64 URL",
            )
    if not found or (spec is not None and spec.provider in IMAGE_PROVIDERS):
        return
    where = param or found[0]
    if spec is None:
        raise unsupported(
            where,
            "a Conductor workflow reads text only: send images to a worker called directly "
            f"(model = its name; providers {IMAGE_WORKERS})",
        )
    raise unsupported(
        where,
        f"worker {spec.name!r} ({spec.provider.value}) is not sent images: they go to workers "
        f"of providers {IMAGE_WORKERS}",
    )

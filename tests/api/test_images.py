"""Images with the official openai client: passed to a worker called directly whose provider
takes them (chat ``image_url`` parts, Responses ``input_image`` parts), refused by name for a
workflow, for a worker without them, and when they are not images."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai.types.responses import ResponseInputItem
from pydantic import TypeAdapter

from fakes.api_fixture import Api

PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwAD"
    "hgGAWjR9awAAAABJRU5ErkJggg=="
)
LOOK = {"type": "text", "text": "What is in this picture?"}


def _image(url: str = PIXEL, detail: str = "low") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": detail}}


def test_a_worker_called_directly_sees_the_images_of_a_user_message(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)

    answer = client.chat.completions.create(
        model="alpha",
        messages=[{"role": "user", "content": [LOOK, _image(), _image(detail="high")]}],  # type: ignore[list-item]
    )

    assert answer.choices[0].message.content == "alpha answers 1 message(s)"
    [sent] = api.workers["alpha"].calls[-1].messages
    assert sent.content == "What is in this picture?"
    assert [(i.url, i.detail) for i in sent.images] == [(PIXEL, "low"), (PIXEL, "high")]


def test_the_responses_api_passes_input_images_and_lists_them_as_sent(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)

    response = client.responses.create(
        model="alpha",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is in this picture?"},
                    {"type": "input_image", "image_url": PIXEL, "detail": "high"},
                ],
            }
        ],
    )

    [sent] = api.workers["alpha"].calls[-1].messages
    assert [(i.url, i.detail) for i in sent.images] == [(PIXEL, "high")]
    [item] = client.responses.input_items.list(response.id).data
    parsed = TypeAdapter(ResponseInputItem).validate_python(item.model_dump())
    assert parsed.content[1].type == "input_image"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (
            {
                "model": "conductor-ultra",
                "messages": [{"role": "user", "content": [LOOK, _image()]}],
            },
            "messages[0].content[1]",
            "workflow reads text only",
        ),
        (
            {"model": "gamma", "messages": [{"role": "user", "content": [LOOK, _image()]}]},
            "messages[0].content[1]",
            "is not sent images",
        ),
        (
            {
                "model": "alpha",
                "messages": [{"role": "user", "content": [_image("http://169.254.169.254/a")]}],
            },
            "messages[0].content[0]",
            "send it inline",
        ),
        (
            {"model": "alpha", "messages": [{"role": "user", "content": [_image("ftp://x/a")]}]},
            "messages[0].content[0]",
            "http(s) URL or a data:image",
        ),
        (
            {
                "model": "alpha",
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": [_image()]},
                ],
            },
            "messages[1].content[0]",
            "images go in user messages",
        ),
        (
            {
                "model": "alpha",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "AA"}}],
                    }
                ],
            },
            "messages[0].content[0]",
            "input_audio content is not supported",
        ),
    ],
    ids=[
        "workflow",
        "worker-without-images",
        "linked-image-to-a-self-hosted-worker",
        "not-an-image-url",
        "assistant-image",
        "audio",
    ],
)
def test_an_image_where_it_cannot_go_is_a_400_naming_it(
    api: Api, body: dict[str, Any], param: str, says: str
) -> None:
    with httpx.Client(
        base_url=api.url, headers={"Authorization": f"Bearer {api.key}"}, timeout=30
    ) as http:
        reply = http.post("/v1/chat/completions", json=body)

    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert says in error["message"]


def test_the_responses_api_refuses_an_image_for_a_workflow_naming_the_part(api: Api) -> None:
    image = {"type": "input_image", "image_url": PIXEL}
    body = {
        "model": "conductor-ultra",
        "input": [
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": [{"type": "input_text", "text": "This?"}, image]},
        ],
    }
    with httpx.Client(
        base_url=api.url, headers={"Authorization": f"Bearer {api.key}"}, timeout=30
    ) as http:
        reply = http.post("/v1/responses", json=body)

    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "input.1.content.1"
    assert "workflow reads text only" in reply.json()["error"]["message"]

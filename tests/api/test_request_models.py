"""The request policy without a server: every field the official ``openai`` package can send
is one the request models decide (honoured, accepted without effect, or refused unless
neutral), so none falls to "unknown" by oversight, and a package that adds one fails here; and
the refusal tables name fields of their models, each neutral when left out."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from openai.types import completion_create_params as legacy_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import input_token_count_params, response_create_params
from pydantic import BaseModel

from conductor_api.chat_request import ChatCompletionRequest
from conductor_api.errors import ApiError
from conductor_api.request_policy import CHAT, COMPLETION, RESPONSES, Refusal, refuse_unsupported
from conductor_api.responses_schemas import CompletionRequest, ResponseCreateRequest
from conductor_api.responses_tokens import InputTokensRequest

SDK_FIELDS: list[tuple[type[BaseModel], set[str]]] = [
    (ChatCompletionRequest, {*chat_params.CompletionCreateParamsBase.__annotations__, "stream"}),
    (CompletionRequest, {*legacy_params.CompletionCreateParamsBase.__annotations__, "stream"}),
    (ResponseCreateRequest, set(response_create_params.ResponseCreateParamsBase.__annotations__)),
    (InputTokensRequest, set(input_token_count_params.InputTokenCountParams.__annotations__)),
]


@pytest.mark.parametrize(("model", "sdk"), SDK_FIELDS, ids=lambda v: getattr(v, "__name__", ""))
def test_every_field_the_sdk_can_send_is_decided(model: type[BaseModel], sdk: set[str]) -> None:
    assert sdk - set(model.model_fields) == set()
    assert model.model_config.get("extra") == "forbid"


TABLES: list[tuple[type[BaseModel], Mapping[str, Refusal]]] = [
    (ChatCompletionRequest, CHAT),
    (CompletionRequest, COMPLETION),
    (ResponseCreateRequest, RESPONSES),
]


@pytest.mark.parametrize(("model", "table"), TABLES, ids=lambda v: getattr(v, "__name__", ""))
def test_each_refusal_names_a_field_of_its_model_neutral_when_left_out(
    model: type[BaseModel], table: Mapping[str, Refusal]
) -> None:
    for name, refusal in table.items():
        assert name in model.model_fields, name
        assert refusal.neutral(model.model_fields[name].get_default(call_default_factory=True))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": False}, "top_logprobs"),  # false is not the integer 0
        ({"top_logprobs": 1}, "top_logprobs"),
        ({"modalities": ["text"]}, None),
        ({"modalities": ["audio"]}, "modalities"),
        ({"logit_bias": {}}, None),
        ({"service_tier": "priority"}, "service_tier"),
        ({"service_tier": "default"}, None),
    ],
)
def test_a_chat_field_is_refused_unless_neutral(
    fields: dict[str, object], param: str | None
) -> None:
    body = ChatCompletionRequest.model_construct(**fields)
    if param is None:
        refuse_unsupported(body, CHAT)
        return
    with pytest.raises(ApiError) as refused:
        refuse_unsupported(body, CHAT)
    assert refused.value.param == param
    assert refused.value.code == "unsupported_parameter"

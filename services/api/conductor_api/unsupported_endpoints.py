"""OpenAI endpoints Conductor has not, answered with a 404 that says so (and what to use
instead) rather than a bare "Not Found" a client's user cannot tell from a wrong base URL."""

from __future__ import annotations

from fastapi import APIRouter

from conductor_api.errors import ApiError

router = APIRouter()
METHODS = ["GET", "POST", "DELETE"]
WHY = {
    "embeddings": "Conductor answers chat completions, responses and completions with "
    "workflows and has no embedding models: call an embedding model's own API",
    "conversations": "continue a response with previous_response_id instead (responses are "
    "stored unless store is false)",
}


def not_supported(endpoint: str) -> ApiError:
    message = f"/v1/{endpoint} is not supported by Conductor: {WHY[endpoint]}"
    return ApiError(404, message, code="unsupported_endpoint")


@router.api_route("/v1/embeddings", methods=METHODS, include_in_schema=False)
async def embeddings() -> None:
    raise not_supported("embeddings")


@router.api_route("/v1/conversations", methods=METHODS, include_in_schema=False)
@router.api_route("/v1/conversations/{rest:path}", methods=METHODS, include_in_schema=False)
async def conversations() -> None:
    raise not_supported("conversations")

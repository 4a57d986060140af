"""Redaction of secrets from what the trace stores."""

from __future__ import annotations

from conductor_adapters.store.redact import REDACTED, redact_strings


def test_every_string_holding_a_secret_is_blanked_however_deep() -> None:
    secret = "sk-live-0123456789"
    payload = {
        "steps": [{"attempts": [{"error": f"401: bad key {secret}"}]}],
        "answer": "fine",
        "n": 3,
    }
    redacted = redact_strings(payload, [secret])
    assert redacted["steps"][0]["attempts"][0]["error"] == f"401: bad key {REDACTED}"
    assert redacted["answer"] == "fine"
    assert redacted["n"] == 3


def test_a_secret_with_characters_json_escapes_is_still_found() -> None:
    secret = 'pa"ss\\word-é-12345'
    redacted = redact_strings({"error": [f"login {secret} refused"]}, [secret])
    assert redacted == {"error": [f"login {REDACTED} refused"]}


def test_a_payload_without_secrets_is_returned_as_it_is() -> None:
    payload = {"answer": "42", "usage": {"prompt_tokens": 3}}
    assert redact_strings(payload, ["sk-not-here-123"]) is payload
    assert redact_strings(payload, []) is payload

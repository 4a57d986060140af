"""Worker pool: the pool file, the default pool, availability and prices."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.chat import Usage
from conductor.errors import ConfigurationError, InvalidRequest
from conductor.pool import (
    LOCAL_WORKER_NAME,
    Price,
    Provider,
    default_pool,
    load_pool_file,
    parse_pool,
)
from conductor.variants import get_variant


def test_default_pool_is_the_local_worker_plus_clouds_whose_key_is_set() -> None:
    assert [w.name for w in default_pool(environ={}).workers] == [LOCAL_WORKER_NAME]

    env = {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "ak-test"}
    pool = default_pool(environ=env)

    assert [w.name for w in pool.workers] == [LOCAL_WORKER_NAME, "openai", "anthropic"]
    assert [w.name for w in pool.available(env)] == [LOCAL_WORKER_NAME, "openai", "anthropic"]
    assert pool.get("anthropic").provider is Provider.ANTHROPIC
    assert pool.unavailable(env) == []


def test_a_worker_whose_key_variable_is_unset_is_listed_with_the_reason() -> None:
    pool = default_pool(environ={"GEMINI_API_KEY": "g"})

    ((gemini, reason),) = pool.unavailable(environ={})
    assert gemini.name == "gemini"
    assert reason == "environment variable GEMINI_API_KEY is not set"


@pytest.mark.parametrize(
    ("fallbacks", "needle"),
    [(["ghost"], "'ghost' are not in the pool"), (["a"], "names itself as a fallback")],
)
def test_fallbacks_must_name_other_workers_of_the_pool(fallbacks: list[str], needle: str) -> None:
    data = {
        "workers": {
            "a": {
                "provider": "openai-compatible",
                "model": "m",
                "base_url": "http://x",
                "fallbacks": fallbacks,
            },
            "b": {"provider": "openai-compatible", "model": "m", "base_url": "http://x"},
        }
    }

    with pytest.raises(ConfigurationError, match=needle):
        parse_pool(data)


def test_pool_file_by_worker_name(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(
        """
workers:
  local-vllm:
    provider: openai-compatible
    model: Qwen/Qwen2.5-7B-Instruct
    base_url: http://vllm:8000/v1
    description: Open model on our GPUs.
    price: {input: 0.1, output: 0.2}
    quotas: {rpm: 600, tpm: 200000, max_concurrency: 64}
  gpt:
    provider: openai
    model: gpt-4.1-mini
    api_key_env: MY_OPENAI_KEY
"""
    )
    pool = load_pool_file(path)

    assert [w.name for w in pool.workers] == ["local-vllm", "gpt"]
    assert pool.get("local-vllm").quotas.max_concurrency == 64
    assert [w.name for w in pool.available({})] == ["local-vllm"]
    assert "MY_OPENAI_KEY is not set" in (pool.get("gpt").availability({}) or "")
    # A snapshot for traces names the key variable, never a key.
    assert pool.get("gpt").snapshot()["api_key_env"] == "MY_OPENAI_KEY"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("workers: [", "not valid YAML"),
        ("nothing: here", "'workers' section"),
        ("workers: {}", "no workers"),
        ("workers:\n  x:\n    provider: carrier-pigeon\n    model: m", "worker 'x': provider"),
        ("workers:\n  Bad Name:\n    provider: openai\n    model: m", "worker 'Bad Name': name"),
        ("workers:\n  x:\n    provider: openai\n    model: m\n    colour: red", "colour"),
        (
            "workers:\n  - {name: a, provider: openai, model: m}\n"
            "  - {name: a, provider: openai, model: n}",
            "duplicate worker names: a",
        ),
        (
            "workers:\n  x: {provider: openai, model: m}\n  x: {provider: gemini, model: g}",
            "found 'x' a second time (first on line 2)",
        ),
        ("workers:\n  x: {provider: openai, model: m, model: n}", "found 'model' a second time"),
        ("workers:\n  x: openai", "worker 'x': expected a mapping of settings"),
        ("workers:\n  - openai", "worker '#1': expected a mapping of settings"),
        ("workers:\n  x: {provider: openai, model: m, max_tokens: '64'}", "max_tokens"),
        ("workers:\n  x: {provider: openai, model: m, stream: 1}", "stream"),
        ("workers:\n  x: {provider: openai, model: m, quotas: {rpm: true}}", "quotas.rpm"),
        ("workers:\n  x: {provider: openai, model: m, price: {input: '1'}}", "price.input"),
    ],
)
def test_bad_pool_files_say_what_is_wrong(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=r"pool\.yaml") as info:
        load_pool_file(path)
    assert needle in str(info.value)


def test_a_pool_file_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_bytes("workers:\n  x: {provider: openai, model: caf\u00e9}\n".encode("latin-1"))
    with pytest.raises(
        ConfigurationError, match=r"pool\.yaml is not UTF-8 text \(byte 43 is 0xe9\)"
    ):
        load_pool_file(path)


def test_numbers_in_a_pool_file_may_be_integers_or_decimals(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(
        "workers:\n  x: {provider: openai, model: m, temperature: 0, timeout_s: 30,"
        " price: {input: 1, output: 2.5}}"
    )
    spec = load_pool_file(path).get("x")
    assert (spec.temperature, spec.timeout_s, spec.price.input, spec.price.output) == (
        0,
        30,
        1,
        2.5,
    )


def test_missing_pool_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read pool file"):
        load_pool_file(tmp_path / "absent.yaml")


def test_price_counts_cached_input_at_its_own_rate() -> None:
    price = Price(input=2.0, cached_input=0.5, output=8.0)
    usage = Usage(prompt_tokens=1_000_000, cached_tokens=400_000, completion_tokens=500_000)
    assert price.cost(usage) == pytest.approx(600_000 * 2.0 / 1e6 + 0.4 * 0.5 + 0.5 * 8.0)
    assert Price(input=2.0).cost(usage) == pytest.approx(2.0)


def test_unknown_variant_names_the_known_ones() -> None:
    with pytest.raises(InvalidRequest, match="conductor-mini, conductor-ultra"):
        get_variant("conductor-mega")

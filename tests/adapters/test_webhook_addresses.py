"""Which addresses webhooks may reach: public ones, and the networks an operator allows
(CONDUCTOR_WEBHOOK_ALLOWED_NETWORKS). Pure: no server, no lookup."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

import pytest

from conductor.errors import ConfigurationError, InvalidRequest
from conductor_adapters.webhooks import allowed_networks, check_url, reachable

ALLOWED = "CONDUCTOR_WEBHOOK_ALLOWED_NETWORKS"

INTERNAL = [
    "http://127.0.0.1:8080/hooks",
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata
    "http://10.1.2.3/hooks",
    "http://172.16.0.1/hooks",
    "http://192.168.1.1/hooks",
    "http://100.64.0.1/hooks",  # shared address space (carrier-grade NAT)
    "http://0.0.0.0:8080/hooks",
    "http://[::1]:8080/hooks",
    "http://[::]/hooks",
    "http://[fc00::1]/hooks",
    "http://[fd12:3456::1]/hooks",
    "http://[fe80::1]/hooks",
    "http://[ff02::1]/hooks",  # multicast
    "http://224.0.1.1/hooks",
    # IPv4 spelt otherwise: as the connection would read them
    "http://2130706433/hooks",
    "http://0x7f.1/hooks",
    "http://127.1/hooks",
    # IPv6 addresses that stand for an internal IPv4 one: mapped, 6to4, NAT64
    "http://[::ffff:10.1.2.3]/hooks",
    "http://[::ffff:169.254.169.254]/hooks",
    "http://[2002:a01:203::1]/hooks",
    "http://[64:ff9b::a01:203]/hooks",
    "http://[64:ff9b:1::1]/hooks",  # local-use NAT64: what it embeds is unknown
    "http://[::7f00:1]/hooks",  # IPv4-compatible: 127.0.0.1
    "http://[::ffff:0:7f00:1]/hooks",  # SIIT IPv4-translated: 127.0.0.1
    "http://[fec0::1]/hooks",  # site-local
]


@pytest.mark.parametrize("url", INTERNAL)
def test_a_url_of_an_internal_address_is_refused_naming_the_field(url: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_url(url, "callback_url", allowed=())
    assert refused.value.param == "callback_url"
    message = str(refused.value)
    assert message.startswith("callback_url: ")
    assert "is not a public address" in message
    assert ALLOWED in message


@pytest.mark.parametrize(
    "url",
    [
        "https://8.8.8.8/hooks",
        "https://[2606:4700:4700::1111]/hooks",
        "http://[::ffff:8.8.8.8]/hooks",
        "http://[64:ff9b::808:808]/hooks",
        "https://hooks.example.com/conductor?token=x",
        # Names are not looked up when a URL is taken: the sender checks what they resolve to
        "http://localhost:8080/hooks",
        "http://metadata.google.internal/computeMetadata/v1/",
    ],
)
def test_a_public_address_or_any_name_is_taken(url: str) -> None:
    assert check_url(url, "--url", allowed=()) == url


def test_an_allowed_network_is_reachable_and_only_it() -> None:
    allowed = (ip_network("127.0.0.0/8"), ip_network("10.8.0.0/16"), ip_network("fd00::/8"))
    for url in ["http://127.0.0.1:9/x", "http://10.8.1.2/x", "http://[fd00::5]/x"]:
        assert check_url(url, "callback_url", allowed=allowed) == url
    for url in ["http://10.9.0.1/x", "http://169.254.169.254/x", "http://[::1]/x"]:
        with pytest.raises(InvalidRequest):
            check_url(url, "callback_url", allowed=allowed)
    # A mapped address is the IPv4 one it stands for, allowed or not
    assert reachable(ip_address("::ffff:10.8.0.1"), allowed)
    assert not reachable(ip_address("::ffff:10.9.0.1"), allowed)


def test_a_url_that_is_no_http_url_is_still_refused_as_such() -> None:
    for url in ["ftp://example.com/x", "http:///x", "http://[::1/x", "https://" + "a" * 2050]:
        with pytest.raises(InvalidRequest, match="expected an http or https URL") as refused:
            check_url(url, "callback_url", allowed=())
        assert refused.value.param == "callback_url"


def test_the_allowed_networks_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOWED, raising=False)
    assert allowed_networks() == ()
    with pytest.raises(InvalidRequest):
        check_url("http://127.0.0.1:9/x", "callback_url")

    monkeypatch.setenv(ALLOWED, " 127.0.0.0/8, fd00::/8,")
    assert allowed_networks() == (ip_network("127.0.0.0/8"), ip_network("fd00::/8"))
    assert check_url("http://127.0.0.1:9/x", "callback_url") == "http://127.0.0.1:9/x"


@pytest.mark.parametrize("value", ["10.0.0.1/8", "not-a-network", "10.0.0.0/33"])
def test_a_bad_network_is_a_configuration_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(ALLOWED, f"127.0.0.0/8,{value}")
    with pytest.raises(ConfigurationError) as bad:
        allowed_networks()
    assert ALLOWED in str(bad.value)
    assert repr(value) in str(bad.value)

"""The Redis broker transport: one client per channel for acks and publishes, threads waiting
for a pool connection instead of failing, and messages delivered and acknowledged as kombu's
own transport does."""

from __future__ import annotations

import base64
import json
import threading

import pytest
import redis
from kombu import Connection

from conductor_adapters.queue import celery_config, new_celery_app, send
from conductor_adapters.redis_broker import TRANSPORT_PATH, Transport
from conductor_adapters.settings import BrokerSettings

pytestmark = pytest.mark.broker


def _settings(redis_url: str, prefix: str) -> BrokerSettings:
    return BrokerSettings(broker_url=redis_url, redis_prefix=prefix)


def test_redis_urls_select_the_shared_client_transport_and_amqp_keeps_its_own(
    redis_url: str, redis_prefix: str
) -> None:
    assert celery_config(_settings(redis_url, redis_prefix))["broker_transport"] == TRANSPORT_PATH
    amqp = BrokerSettings(broker_url="amqp://guest:guest@127.0.0.1:5672//")
    assert celery_config(amqp)["broker_transport"] is None
    app = new_celery_app("broker-test", _settings(redis_url, redis_prefix))
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)


def test_acks_from_40_threads_at_once_all_land_through_one_client(
    redis_url: str, redis_prefix: str
) -> None:
    app = new_celery_app("broker-test", _settings(redis_url, redis_prefix))
    with app.connection_for_write() as connection:
        assert isinstance(connection, Connection)
        channel = connection.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        queue = connection.SimpleQueue(f"{redis_prefix}q")
        for n in range(40):
            queue.put({"n": n})
        messages = [queue.get(timeout=5) for _ in range(40)]
        # Acks come from Celery's task threads, 40 here at once against a pool of 10
        # connections: kombu's own pool refuses those past the tenth ("Too many connections"),
        # and each refused ack would have its message delivered again.
        threads = [threading.Thread(target=m.ack) for m in messages]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert sorted(m.payload["n"] for m in messages) == list(range(40))
        queue.close()
    with redis.Redis.from_url(redis_url) as client:
        # kombu keeps each delivered message in the unacked hash until its ack.
        assert client.hlen(f"{redis_prefix}unacked") == 0
        assert client.llen(f"{redis_prefix}{redis_prefix}q") == 0


def test_a_sent_message_names_its_arguments_without_their_text(
    redis_url: str, redis_prefix: str
) -> None:
    # Given a task message whose argument carries a user's question
    app = new_celery_app("broker-test", _settings(redis_url, redis_prefix))
    question = "What is the access code of the vault?"

    # When it is sent
    send(app, "conductor.test.task", [{"question": question}], "quiet")

    # Then the body carries the argument, and the headers do not repeat it
    with redis.Redis.from_url(redis_url) as client:
        [raw] = client.lrange(f"{redis_prefix}quiet", 0, -1)
        client.delete(f"{redis_prefix}quiet")
    message = json.loads(raw)
    headers = message["headers"]
    assert headers["argsrepr"] == "<not shown>"
    assert question not in json.dumps(headers)
    [args, _kwargs, _embed] = json.loads(base64.b64decode(message["body"]))
    assert args == [{"question": question}]

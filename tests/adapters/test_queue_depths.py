"""What the aggregator reports as each gateway queue's backlog, read from both real brokers."""

from __future__ import annotations

import uuid

import pytest

from conductor_adapters.queue import new_celery_app, queue_depths
from conductor_adapters.settings import BrokerSettings

pytestmark = pytest.mark.broker


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_the_backlog_counts_waiting_messages_and_a_missing_queue_as_empty(
    broker: str, redis_url: str, redis_prefix: str, request: pytest.FixtureRequest
) -> None:
    # Given a queue holding three messages no one consumes (the Redis broker with the key
    # prefix every deployment sets: kombu's own existence check misses prefixed queues)
    url = redis_url if broker == "redis" else str(request.getfixturevalue("amqp_url"))
    app = new_celery_app(
        "conductor_test_depths", BrokerSettings(broker_url=url, redis_prefix=redis_prefix)
    )
    queue = f"gateway.test-{uuid.uuid4().hex[:8]}"
    try:
        for number in range(3):
            app.send_task("conductor.test.nothing", args=[number], queue=queue)

        # When the backlog is read, with a queue that was never declared
        depths = queue_depths(app, [queue, f"{queue}-never-declared"])

        # Then the waiting messages are counted, and the missing queue is empty, not an error
        assert depths == {queue: 3, f"{queue}-never-declared": 0}
    finally:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(queue)
        app.close()

"""The Redis broker wakes an idle worker when work arrives, instead of leaving it to its next poll."""

import os
import threading
import time

import dramatiq
import pytest
from django.conf import settings

from core.queue import WakingRedisBroker

pytestmark = pytest.mark.services


@pytest.fixture
def broker():
    namespace = f"{os.environ.get('WARDEN_QUEUE_NAMESPACE', 'warden')}-wake-test"
    broker = WakingRedisBroker(url=settings.REDIS_URL, namespace=namespace)
    broker.declare_queue("wake")
    yield broker
    for key in broker.client.scan_iter(f"{namespace}:*"):
        broker.client.delete(key)
    broker.close()


def test_an_idle_consumer_is_woken_by_a_new_message_instead_of_sleeping_out_its_back_off(broker):
    consumer = broker.consume("wake", prefetch=1, timeout=60_000)
    consumer.misses = 30  # idle for long: its back-off is the whole minute
    got = []

    def take():
        got.append(next(consumer))  # no message yet: it waits on its back-off, then returns None
        got.append(next(consumer))

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    time.sleep(0.3)  # the consumer is in its back-off now
    assert thread.is_alive() and not got
    broker.enqueue(dramatiq.Message(queue_name="wake", actor_name="noop", args=(), kwargs={}, options={}))
    thread.join(timeout=10)  # a sleeping consumer would wake in 60 s
    assert not thread.is_alive(), "the consumer did not wake up for the new message"
    assert got[0] is None and got[1].actor_name == "noop"
    consumer.ack(got[1])
    consumer.close()


def test_the_wake_up_list_stays_short_while_nobody_is_idle(broker):
    from core.queue import WAKE_BACKLOG, wake_key

    for _ in range(WAKE_BACKLOG + 50):
        broker.enqueue(dramatiq.Message(queue_name="wake", actor_name="noop", args=(), kwargs={}, options={}))
    assert broker.client.llen(wake_key(broker.namespace, "wake")) == WAKE_BACKLOG

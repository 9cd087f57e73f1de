"""Dramatiq's Redis broker, with idle workers woken by new work instead of finding it at their next poll.

Dramatiq's Redis consumer sleeps out an exponential back-off (up to the worker timeout) each time it
finds its queue empty, so an idle worker learns of a new message up to that long after it was sent: a
decision that resumes a parked task, or a run started on a quiet system, waits for a poll. Here each
enqueue also pushes a token onto a short per-queue list, and an idle consumer spends its back-off in a
blocking pop on that list instead of a sleep: it wakes as soon as work arrives, and otherwise after the
same back-off as before. The messages themselves go through Dramatiq's own scripts, unchanged; a lost or
stale token costs at most one poll interval or one empty fetch, never a message.
"""

from __future__ import annotations

import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff
from dramatiq.errors import ConnectionClosed

# Tokens beyond the number of consumers wake nobody useful: the list is kept this short.
WAKE_BACKLOG = 64
MAX_BLOCK_MS = 2000


def wake_key(namespace: str, queue_name: str) -> str:
    return f"{namespace}:wake:{queue_name}"


class _WakingConsumer(_RedisConsumer):
    def __next__(self):
        if self.message_cache or self.outstanding_message_count >= self.prefetch:
            return super().__next__()  # a prefetched message, or no room to fetch: Dramatiq's own path
        try:
            messages = self.broker.do_fetch(self.queue_name, self.prefetch - self.outstanding_message_count)
            if not messages:
                self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
                # Capped below the client's socket timeout: a long block must not read as a dead Redis.
                block = min(backoff_ms, MAX_BLOCK_MS) / 1000
                self.broker.client.blpop([wake_key(self.broker.namespace, self.queue_name)], block)
                return None
        except redis.ConnectionError as e:
            raise ConnectionClosed(e) from None
        self.message_cache = messages
        return super().__next__()


class WakingRedisBroker(RedisBroker):
    """RedisBroker whose idle consumers block on a wake-up list (see the module's docstring)."""

    @property
    def consumer_class(self):
        return _WakingConsumer

    def enqueue(self, message, *, delay=None):
        message = super().enqueue(message, delay=delay)
        # The queue it went to: a delayed message lands on the delay queue, whose consumer holds it
        # until its time and then enqueues it again (waking the main queue's consumer then).
        key = wake_key(self.namespace, message.queue_name)
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(key, 1)
        pipe.ltrim(key, -WAKE_BACKLOG, -1)
        pipe.execute()
        return message

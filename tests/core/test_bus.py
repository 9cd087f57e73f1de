"""The bus's typed announcements: a durable subscriber writes with the fact, the others hear after commit,
and nobody hears of a fact that rolled back."""

import pytest
from django.db import transaction

from core import bus

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


@pytest.fixture
def heard():
    got = {"durable": [], "after": []}

    def durable(event):
        got["durable"].append((event, transaction.get_connection().in_atomic_block))

    def after(event):
        got["after"].append((event, transaction.get_connection().in_atomic_block))

    bus.subscribe(bus.TaskParked, durable, durable=True)
    bus.subscribe(bus.TaskParked, after)
    bus.subscribe(bus.TaskParked, after)  # twice: still heard once
    yield got
    bus._subscribers[bus.TaskParked] = [e for e in bus._subscribers[bus.TaskParked] if e[0] not in (durable, after)]


def test_a_durable_subscriber_hears_inside_the_transaction_the_others_after_commit(heard):
    event = bus.TaskParked(run_id=1, task_id=2, reason="approval")
    with transaction.atomic():
        bus.announce(event)
        assert heard["durable"] == [(event, True)] and heard["after"] == []
    assert heard["after"] == [(event, False)]


def test_nobody_after_commit_hears_of_a_fact_that_rolled_back(heard):
    with pytest.raises(Boom), transaction.atomic():
        bus.announce(bus.TaskParked(run_id=1, task_id=2, reason="approval"))
        raise Boom
    assert len(heard["durable"]) == 1 and heard["after"] == []

"""How many SQL statements and transactions each path of the engine costs, pinned per database.

Timings are for bench/; these counts are what a change must explain: a feature that adds a statement to
a run's start, a step, a hop, a settlement, a tool call or an approval's resume fails its case here, and
its commit says why the statement is worth it. Each case's id carries its counts ("statements/transactions"
on SQLite and on PostgreSQL); the message lists the statements that ran.

Counted: every statement of the path's thread on the connection, the ORM's and core.sql's (which, on
PostgreSQL, runs on a cursor of its own), savepoints included; the outbox thread's batched deletes of sent
rows are not the path's (one statement per batch, for every message the process sent meanwhile).
Transactions: commits of outermost atomic blocks, plus each statement run outside one (autocommit). The
sandbox systems' own writes are the outside world's, not the engine's: counted apart and left out.
"""

import importlib
import re
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from unittest import mock

import dramatiq
import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections

from agents.models import Agent, Workflow
from core import sql as core_sql
from policy.models import ApprovalRequest
from runs.models import Run, Task
from runs.services import completion, run_start
from tests.conftest import decide

SANDBOX = re.compile(r'\b(INTO|UPDATE|FROM)\s+"?tools_sandbox', re.IGNORECASE)


@dataclass
class Count:
    statements: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # the sandbox systems' statements
    commits: int = 0
    autocommitted: int = 0

    @property
    def transactions(self) -> int:
        return self.commits + self.autocommitted

    def seen(self, sql: str) -> None:
        if SANDBOX.search(sql):
            self.outside.append(sql)
            return
        if sql.startswith("BEGIN"):
            return  # SQLite's BEGIN opens the atomic block being entered: counted as its transaction
        self.statements.append(sql)
        if not connection.in_atomic_block:
            self.autocommitted += 1

    def __sub__(self, other: "Count") -> tuple[int, int]:
        return len(self.statements) - len(other.statements), self.transactions - other.transactions

    def listing(self) -> str:
        return "\n".join(f"  {n}. {' '.join(s.split())[:160]}" for n, s in enumerate(self.statements, 1))


@contextmanager
def counting():
    found = Count()

    def wrapper(execute, sql, params, many, context):
        found.seen(sql)
        return execute(sql, params, many, context)

    run = core_sql._run
    here = threading.current_thread()
    wrapped = connections[DEFAULT_DB_ALIAS]
    commit = wrapped.commit

    def counted_commit():
        found.commits += 1
        return commit()

    def raw(sql, params, fetch):
        if threading.current_thread() is here:  # not the outbox thread's batched deletes (runs/services/outbox.py)
            found.seen(sql)
        return run(sql, params, fetch)

    with (
        connection.execute_wrapper(wrapper),
        mock.patch.object(wrapped, "commit", counted_commit),
        # On SQLite core.sql runs on Django's cursor, which the wrapper sees already.
        mock.patch.object(core_sql, "_run", raw) if connection.vendor == "postgresql" else nullcontext(),
    ):
        yield found


class Messages:
    """The broker's messages, held here: the test delivers them, one at a time, on this thread."""

    def __init__(self, monkeypatch):
        self.held: list = []
        self.broker = dramatiq.get_broker()
        monkeypatch.setattr(self.broker, "enqueue", lambda message, *, delay=None: self.held.append(message))

    def deliver(self, actor: str = "execute_task", **match) -> None:
        message = next(
            m for m in self.held if m.actor_name == actor and all(m.kwargs.get(k) == v for k, v in match.items())
        )
        self.held.remove(message)
        self.broker.get_actor(message.actor_name).fn(**message.kwargs)

    def task_ids(self) -> list[int]:
        return [m.kwargs["task_id"] for m in self.held if m.actor_name == "execute_task"]


def _agent(slug: str, script: list[dict], tools: tuple = ()) -> Agent:
    return Agent.objects.create(slug=slug, name=slug, script=script, allowed_tools=list(tools))


@pytest.fixture
def workflows(transactional_db):
    done = {"final": {"done": True}}
    _agent("one-step", [done])
    for n in (3, 4):
        _agent(f"steps-{n}", [{"say": "step {turn}", "repeat": n - 1}, done])
    read = {"say": "reading", "tool": "deployments.read", "arguments": {"service": "checkout"}}
    _agent("reads", [read, done], ("deployments.read",))
    _agent("speaks", [{"say": "two", "repeat": 1}, done])
    mail = {"tool": "email.send", "arguments": {"to": "a@example.com", "subject": "hi", "body": "hello"}}
    _agent("mails", [mail, done], ("email.send",))
    for slug in ("one-step", "steps-3", "steps-4", "reads", "speaks", "mails"):
        Workflow.objects.create(slug=slug, name=slug, tasks=[{"key": "t", "agent": slug, "objective": "go"}])
    chain = [{"key": "a", "agent": "one-step", "objective": "go"}]
    chain.append({"key": "b", "agent": "one-step", "objective": "go", "depends_on": ["a"]})
    Workflow.objects.create(slug="chain", name="chain", tasks=chain)


def started(workflow: str, messages: Messages) -> Run:
    run = run_start(workflow=workflow)
    assert messages.task_ids(), "the run's start sent no task"
    return run


def executed(run: Run, messages: Messages, key: str = "t") -> Count:
    task = Task.objects.get(run=run, key=key)
    with counting() as found:
        messages.deliver(task_id=task.id)
    return found


def only(found: Count) -> tuple[int, int]:
    return len(found.statements), found.transactions


# (path, {vendor: (statements, transactions)}, what it measures). The ids carry the counts.
EXPECTED = {
    # was 12 in 8: six reads outside a transaction, each version read apart, the new run's tasks read back;
    # then 9 in 2: the outbox row's delete after the send is now the outbox thread's, in batches
    "run_start": {"sqlite": (8, 1), "postgresql": (8, 1)},
    "step": {"sqlite": (3, 1), "postgresql": (1, 1)},
    # was 17/11 in 3: the settlement's two statements fewer (below); then 9 in 3 on PostgreSQL: the
    # task's context comes back with its claim (as at a hop, below)
    "one_task_run": {"sqlite": (16, 3), "postgresql": (8, 2)},
    # was 12 in 4 / 5 in 4: on PostgreSQL the successor's context comes back with its claim's statement, and
    # its inputs are marked verified by its first journal statement instead of a commit of their own
    "hop": {"sqlite": (12, 3), "postgresql": (3, 2)},
    # was 7: the proposals' check ran twice (bundle, then drop); then 6: the check rides on the query of
    # the tasks' statuses, and on PostgreSQL the root span's end on the run's update (a CTE)
    "settlement": {"sqlite": (5, 0), "postgresql": (4, 0)},
    "tool_read": {"sqlite": (7, 5), "postgresql": (5, 5)},
    # was 20 in 5: the resumed task's message no longer has its outbox row deleted by the decider
    "approval_resume": {"sqlite": (19, 4), "postgresql": (19, 4)},
}


def _id(path: str) -> str:
    sqlite, pg = EXPECTED[path]["sqlite"], EXPECTED[path]["postgresql"]
    return f"{path}-sqlite-{sqlite[0]}st-{sqlite[1]}tx-postgresql-{pg[0]}st-{pg[1]}tx"


def measure(path: str, messages: Messages, reviewer) -> tuple[tuple[int, int], str]:
    """(statements, transactions) of one path, and the listing that explains them."""
    if path == "run_start":
        with counting() as found:
            started("one-step", messages)
        return only(found), found.listing()
    if path == "step":
        # A task of four steps against one of three: what one more journaled step costs.
        three = executed(started("steps-3", messages), messages)
        four = executed(started("steps-4", messages), messages)
        return four - three, four.listing()
    if path == "tool_read":
        # A read through the broker (intent, call, receipt) against a plain model step in its place.
        said = executed(started("speaks", messages), messages)
        read = executed(started("reads", messages), messages)
        return read - said, read.listing()
    if path == "one_task_run":
        # The worker's whole share of a one-task, one-step run: claim, step, finish, settlement.
        found = executed(started("one-step", messages), messages)
        return only(found), found.listing()
    if path == "hop":
        # A chain of two one-step tasks against a run of one: the worker that finishes the first task
        # claims the second itself.
        alone = executed(started("one-step", messages), messages)
        run = started("chain", messages)
        chain = executed(run, messages, "a")
        assert Task.objects.get(run=run, key="b").status == Task.Status.COMPLETED
        return chain - alone, chain.listing()
    if path == "settlement":
        # The statements of the run's settlement alone (from the last task's finish to the run's status).
        spans = []
        settle = completion._run_settle

        def marked(*args, **kwargs):
            spans.append(len(found.statements))
            try:
                return settle(*args, **kwargs)
            finally:
                spans.append(len(found.statements))

        run = started("one-step", messages)
        task = Task.objects.get(run=run)
        with counting() as found, mock.patch.object(completion, "_run_settle", marked):
            messages.deliver(task_id=task.id)
        assert Run.objects.get(id=run.id).status == Run.Status.COMPLETED
        settled = Count(statements=found.statements[spans[0] : spans[-1]])
        settled.autocommitted = 0  # it runs inside the finishing task's transaction
        return (len(settled.statements), 0), settled.listing()
    # An approval of an irreversible call: the decision, through to the resumed task's message.
    run = started("mails", messages)
    executed(run, messages)
    request = ApprovalRequest.objects.get(run=run, status="pending")
    with counting() as found:
        decide(request_id=request.id, user=reviewer, approve=True)
    assert messages.task_ids(), "the approval resumed nothing"
    return only(found), found.listing()


def approver():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("rita", password="reviewer-pass-123", is_staff=True)


@pytest.mark.parametrize("path", list(EXPECTED), ids=[_id(p) for p in EXPECTED])
def test_each_engine_path_takes_its_pinned_number_of_statements_and_transactions(path, workflows, monkeypatch):
    messages = Messages(monkeypatch)
    # What happens once per database: the default project is created by the first run, the tool
    # installation's row by the first tool call.
    executed(started("reads", messages), messages)
    reviewer = approver()
    (statements, transactions), listing = measure(path, messages, reviewer)
    want = EXPECTED[path][connection.vendor]
    assert (statements, transactions) == want, (
        f"{path} on {connection.vendor}: {statements} statements in {transactions} transactions, pinned at "
        f"{want[0]} in {want[1]}; if the change is worth it, say why and pin the new count.\n{listing}"
    )


# Where each path is made one statement longer on purpose: a function it runs once (more, for the
# differences: once more in the longer of the two runs it compares).
ADDED_AT = {
    "run_start": ("runs.services.runs", "tasks_create"),
    "step": ("runs.services.hot", "journal_step"),
    "one_task_run": ("runs.services.hot", "claim_fresh"),
    "hop": ("runs.services.completion", "claim"),
    "settlement": ("runs.services.completion", "_run_settle"),
    "tool_read": ("tools.broker", "_record_read"),
    "approval_resume": ("approvals.services", "_decide"),
}


@pytest.mark.parametrize("path", list(EXPECTED))
def test_a_statement_added_to_a_path_on_purpose_is_caught_by_its_count(path, workflows, monkeypatch):
    """The counts above are not blind: one statement more, where the path surely runs, fails its case."""
    module, name = ADDED_AT[path]
    module = importlib.import_module(module)
    original = getattr(module, name)

    def one_statement_more(*args, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return original(*args, **kwargs)

    messages = Messages(monkeypatch)
    executed(started("reads", messages), messages)
    reviewer = approver()
    monkeypatch.setattr(module, name, one_statement_more)
    (statements, _), listing = measure(path, messages, reviewer)
    want = EXPECTED[path][connection.vendor]
    assert statements == want[0] + 1, f"{path}: {statements} statements with one added, pinned at {want[0]}\n{listing}"

"""A stateful property test of the gate: random projects and roles, approval policies, allow rules (with
random creators, scopes, expiries and marks), runs started by random people in propose mode or not, tool
calls, decisions by random people, resumes, bundles and the supervisor's executions.

The invariant, checked after every step against a model the test keeps itself (not the gate's own code):
no call reaches a system unless

1. the decisions recorded on its operation satisfy the strictest requirement that matched it when it was
   judged: as many distinct approvals of exactly its arguments as the largest quorum, each from someone
   who may decide it when the call leaves (a project admin where any match said admins only), or
2. an allow rule stood in, and that rule was valid for that call: of the run's project, tool, run and
   agent, covering its arguments, not revoked nor expired, its creator not the run's starter and able to
   approve it alone (a quorum of one, an admin where admins only, an admin's mark for an irreversible call),
   and no propose mode;

and none of its approvers started its run. What the gate stored is at least as strict as the model.
"""

import os
from dataclasses import dataclass

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agents.models import Agent
from approvals.models import AllowRule, ApprovalPolicy, ApprovalRequest
from approvals.services import approval_decide
from core.errors import WardenError
from runs.models import Run
from runs.saga import proposals_bundle_if_any, run_operations
from runs.services import run_start
from tenancy.access import authorize, membership_grant, membership_revoke, role_of
from tenancy.models import Membership, Project
from tests.conftest import SQLITE
from tests.runs.test_engine import scripted_workflow
from tools import broker
from tools.models import SandboxCall, ToolOperation

TOOLS = {  # tool → (is a write, is irreversible)
    "email.send": (True, True),
    "tickets.create": (True, False),
    "crm.read": (False, False),
}
ARGUMENTS = {
    "email.send": {"to": "a@customer.example", "subject": "Incident", "body": "We are on it."},
    "tickets.create": {"customer_id": "cust-a", "title": "Checkout down"},
    "crm.read": {"customer_id": "cust-a"},
}
USERS = ["u0", "u1", "u2", "u3", "u4"]
ROLES = [None, "viewer", "operator", "reviewer", "admin"]
DECIDERS = ("reviewer", "admin")
OS = ToolOperation.Status
START = {"project": st.integers(0, 1), "starter": st.sampled_from([None, *USERS]), "propose": st.booleans()}
POLICY = {
    "project": st.sampled_from([None, 0, 1]),
    "tool": st.sampled_from(["", *TOOLS]),
    "quorum": st.sampled_from([1, 1, 1, 2, 3]),
    "admins": st.sampled_from([False, False, False, True]),
    "enabled": st.sampled_from([True, True, False]),
}
ALLOW_RULE = {
    "creator": st.sampled_from(USERS),
    "project": st.integers(0, 1),
    "tool": st.sampled_from(list(TOOLS)),
    "scope": st.sampled_from(["project", "project", "run", "agent", "other agent"]),
    "covers": st.sampled_from([True, True, False]),
    "expired": st.sampled_from([False, False, False, False, True]),
    "exact": st.sampled_from([True, True, True, False]),
}


@dataclass(frozen=True)
class Need:
    """What the model says a call needs: nothing, or approvals (quorum, admins only)."""

    approval: bool
    quorum: int = 0
    admins_only: bool = False
    irreversible: bool = False
    propose: bool = False


class GateMachine(RuleBasedStateMachine):
    workflow = "gate-stateful"  # made by the fixture, with its agent allowed every tool above

    def __init__(self):
        super().__init__()
        self.runs: dict[int, dict] = {}
        self.needs: dict[str, Need] = {}  # idempotency key → what the model said when it was judged
        self.verified: set[str] = set()

    @initialize(
        # Deciding roles more often than not: the interesting calls are those someone may wave through.
        roles=st.lists(
            st.sampled_from([*ROLES, "reviewer", "admin"]), min_size=2 * len(USERS), max_size=2 * len(USERS)
        ),
        policies=st.integers(0, 3),
        rules=st.integers(1, 4),
        runs=st.integers(1, 2),
        data=st.data(),
    )
    def fresh(self, roles, policies, rules, runs, data):
        # Examples share the test's database: each starts with no policy or rule, and its own memberships.
        ApprovalPolicy.objects.all().delete()
        AllowRule.objects.all().delete()
        Membership.objects.all().delete()
        self.users = {u: type(self).people[u] for u in USERS}
        self.projects = list(type(self).projects)
        self.agent_id = Agent.objects.get(slug=f"{self.workflow}-agent").id
        for n, role in enumerate(roles):
            if role is not None:
                membership_grant(
                    user=self.users[USERS[n % len(USERS)]], project=self.projects[n // len(USERS)], role=role
                )

    # --- the world ---------------------------------------------------------------------------------

    @rule(user=st.sampled_from(USERS), project=st.integers(0, 1), role=st.sampled_from(ROLES))
    def grant(self, user, project, role):
        if role is None:
            membership_revoke(user=self.users[user], project=self.projects[project])
        else:
            membership_grant(user=self.users[user], project=self.projects[project], role=role)

    @rule(**POLICY)
    def add_policy(self, project, tool, quorum, admins, enabled):
        ApprovalPolicy.objects.create(
            name="p",
            project=None if project is None else self.projects[project],
            tool=tool,
            quorum=quorum,
            decided_by_role="admin" if admins else "reviewer",
            enabled=enabled,
        )

    @rule(data=st.data(), **ALLOW_RULE)
    def add_allow_rule(self, data, creator, project, tool, scope, covers, expired, exact):
        """Written straight to the table: whatever its creation allowed (or a later role change), the
        gate must judge it at each call."""
        runs = [r for r, facts in self.runs.items() if facts["project"] == project]
        run_id = data.draw(st.sampled_from(runs)) if scope == "run" and runs else None
        # Often the starter of one of the project's runs: separation of duties must hold through rules.
        starters = sorted({f["starter"] for r, f in self.runs.items() if f["project"] == project and f["starter"]})
        if starters and data.draw(st.booleans(), label="a starter's rule"):
            starter = data.draw(st.sampled_from(starters), label="starter")
            creator = next(u for u, user in self.users.items() if user.pk == starter)
        agent_id = (
            self.agent_id
            if scope == "agent"
            else (Agent.objects.get(slug="inventory-agent").id if scope == "other agent" else None)
        )
        now = timezone.now()
        AllowRule.objects.create(
            project=self.projects[project],
            tool=tool,
            arguments=dict(ARGUMENTS[tool]) if exact else {"customer_id": "someone-else"},
            run_id=run_id,
            agent_id=agent_id,
            covers_irreversible=covers,
            created_by=self.users[creator],
            expires_at=now - timezone.timedelta(seconds=1) if expired else now + timezone.timedelta(days=1),
        )

    @rule(**START)
    def start(self, project, starter, propose):
        user = self.users[starter] if starter else None
        run = run_start(
            workflow=self.workflow,
            project=self.projects[project],
            started_by=user,
            input={"propose_tools": ["email.send", "tickets.create"]} if propose else {},
        )
        self.runs[run.id] = {"project": project, "starter": user.pk if user else None, "propose": propose, "step": 0}

    # --- calls, decisions, executions --------------------------------------------------------------

    def callable_runs(self):
        return sorted(r for r, f in self.runs.items() if not f.get("bundled"))

    @precondition(lambda self: self.callable_runs())
    @rule(data=st.data(), tool=st.sampled_from(list(TOOLS)), last=st.booleans())
    def call(self, data, tool, last):
        """The run's agent calls a tool. In propose mode, its last call ends its work: what it proposed is
        bundled for one approval, as the end of a run's tasks does."""
        run_id = data.draw(st.sampled_from(self.callable_runs()), label="run")
        facts = self.runs[run_id]
        facts["step"] += 1
        run = Run.objects.get(id=run_id)
        task = run.tasks.get()
        key = broker.idempotency_key(run_id=run_id, task_key=task.key, step=facts["step"])
        self.needs[key] = self.need(run, tool)
        self._deliver(run, task, facts["step"], tool)
        if facts["propose"] and last:
            facts["bundled"] = True
            with transaction.atomic():
                locked = Run.objects.select_for_update().get(id=run_id)
                if locked.status == Run.Status.RUNNING:
                    proposals_bundle_if_any(locked, timezone.now())

    @precondition(lambda self: self.callable_runs())
    @rule(data=st.data(), tool=st.sampled_from(list(TOOLS)), last=st.booleans())
    def another_call(self, data, tool, last):
        """(The same as ``call``: calls are what the invariant is about, so they come twice as often.)"""
        self.call(data, tool, last)

    def _deliver(self, run, task, step, tool):
        try:
            broker.tool_call(run=run, task=task, step=step, call_number=step, name=tool, arguments=ARGUMENTS[tool])
        except broker.TaskParked:
            pass
        except WardenError:
            pass  # a rejection that fails the task, say: not the subject here

    def pending(self):
        return ApprovalRequest.objects.filter(status="pending", run_id__in=list(self.runs))

    @precondition(lambda self: self.runs and self.pending().exists())
    @rule(data=st.data(), approve=st.sampled_from([True, True, True, False]))
    def decide(self, data, approve):
        """Someone decides a pending request (as the API, the queue and the admin do: the role first, then
        the service), and what the decision wakes goes on: the parked agent asks the broker again, the
        supervisor's executor runs what its bundle's reviewers approved."""
        pending = list(self.pending().order_by("id").values_list("id", flat=True))
        request = ApprovalRequest.objects.select_related("run").get(id=data.draw(st.sampled_from(pending)))
        # Anyone; more often one who holds a deciding role in the request's project.
        members = Membership.objects.filter(project_id=request.run.project_id, role__in=DECIDERS)
        deciders = sorted(members.values_list("user__username", flat=True))
        user = self.users[data.draw(st.sampled_from([*deciders, *deciders, *USERS]), label="who")]
        try:
            authorize(user, request.run.project_id, "decide", what="a request")
            approval_decide(
                request_id=request.id, user=user, approve=approve, note="" if approve else "no",
                seen_hash=request.arguments_hash,
            )  # fmt: skip
        except WardenError:
            return
        for op in ToolOperation.objects.filter(run_id=request.run_id, proposed=False).exclude(
            status__in=[OS.COMMITTED, OS.AWAITING_APPROVAL]
        ):
            self._deliver(op.run, op.task, op.step, op.tool)
        run_operations(request.run_id)

    # --- the model ---------------------------------------------------------------------------------

    def need(self, run: Run, tool: str) -> Need:
        write, irreversible = TOOLS[tool]
        facts = self.runs[run.id]
        propose = facts["propose"] and write
        matched = [
            p
            for p in ApprovalPolicy.objects.filter(enabled=True)
            if (p.project_id in (None, run.project_id))
            and (p.workflow_id in (None, run.workflow_id))
            and (p.tool == tool or (p.tool == "" and write))
        ]
        if not matched and not propose:
            return Need(approval=False)
        quorum = max([p.quorum for p in matched] + [1])
        admins = any(p.decided_by_role == "admin" for p in matched)
        return Need(True, quorum, admins, irreversible, propose)

    def rule_valid(self, rule: AllowRule, op: ToolOperation, need: Need, facts: dict) -> bool:
        role = role_of(rule.created_by, op.run.project_id)
        return (
            rule.project_id == op.run.project_id
            and rule.tool == op.tool
            and rule.run_id in (None, op.run_id)
            and rule.agent_id in (None, self.agent_id)
            and rule.revoked_at is None
            and rule.expires_at > op.created_at
            and all(ARGUMENTS[op.tool].get(k) == v for k, v in rule.arguments.items())
            and rule.created_by_id != facts["starter"]
            and role in DECIDERS
            and need.quorum <= 1
            and (not need.admins_only or role == "admin")
            and (not need.irreversible or (rule.covers_irreversible and role == "admin"))
            and not need.propose
        )

    @invariant()
    def nothing_leaves_without_the_yes_it_needs(self):
        left = SandboxCall.objects.filter(idempotency_key__in=list(self.needs)).exclude(
            idempotency_key__in=list(self.verified)
        )
        for key in set(left.values_list("idempotency_key", flat=True)):
            op = ToolOperation.objects.select_related("run", "approval").get(idempotency_key=key)
            need, facts, verdict = self.needs[key], self.runs[op.run_id], op.verdict
            assert verdict["quorum"] >= (need.quorum if need.approval else 0), (key, need, verdict)
            assert verdict["admins_only"] or not need.admins_only, (key, need, verdict)
            event(f"left: {'by a rule' if verdict.get('allow_rule') else 'approved' if need.approval else 'free'}")
            if need.approval:
                if verdict.get("allow_rule"):
                    rule = AllowRule.objects.select_related("created_by").get(id=verdict["allow_rule"])
                    assert self.rule_valid(rule, op, need, facts), (key, need, rule.__dict__)
                else:
                    assert op.approval is not None, (key, need, verdict)
                    approvers = set(
                        op.approval.decisions.filter(verdict="approve", arguments_hash=op.arguments_hash).values_list(
                            "reviewer_id", flat=True
                        )
                    )
                    assert facts["starter"] not in approvers, (key, approvers)
                    eligible = ("admin",) if need.admins_only else DECIDERS
                    deciders = [u for u in approvers if role_of(self._user(u), op.run.project_id) in eligible]
                    assert len(deciders) >= need.quorum, (key, need, approvers)
            self.verified.add(key)

    def _user(self, pk):
        return next(u for u in self.users.values() if u.pk == pk)


@pytest.fixture
def gate_machine(demo, django_user_model, monkeypatch):
    scripted_workflow(GateMachine.workflow, [{"final": {}}], tools=list(TOOLS))
    GateMachine.people = {u: django_user_model.objects.create_user(username=u, password=f"{u}-pass-123") for u in USERS}
    GateMachine.projects = [
        Project.objects.create(slug="alpha", name="Alpha"),
        Project.objects.create(slug="beta", name="Beta"),
    ]
    monkeypatch.setattr("runs.heartbeat.lease_keeper.hold_executor", lambda run_id, token: None)
    broker.circuit_reset()
    yield GateMachine
    broker.circuit_reset()


def test_nothing_leaves_without_the_right_peoples_yes(gate_machine):
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        gate_machine,
        settings=settings(
            # 500 in embedded mode; scaled mode, several times slower per example, runs 60 of the same.
            max_examples=int(os.environ.get("WARDEN_GATE_EXAMPLES", 500 if SQLITE else 60)),
            stateful_step_count=20,
            deadline=None,
            database=None,  # examples hold ids of a rolled-back test database: nothing worth replaying
            derandomize=os.environ.get("WARDEN_REQUIRE_SERVICES") == "1",  # CI: one fixed, reproducible set
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )

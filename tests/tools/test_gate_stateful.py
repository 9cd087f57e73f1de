"""A stateful property test of the gate: random projects and roles, approval policies and waivers, allow
rules (with random creators, scopes, expiries and marks), runs started by random people in propose mode
or not, tool calls, decisions by random people, resumes, bundles and the supervisor's executions; and each
project's own declared tools, declared and edited at random: an HTTP tool (any method, any claimed class
and reversibility, a secret granted to the project or not, saved through the checks or written straight
to the table) on a real HTTP service on 127.0.0.1, and the tools of a real MCP server (examples/refunds/
tickets_mcp.py over streamable HTTP) with random annotations and random classes confirmed by the project,
edited after calls were approved.

The invariant, checked after every step against a model the test keeps itself (not the gate's own code):
no call reaches a system unless

1. the decisions recorded on its operation satisfy the strictest requirement that matched it: when it was
   judged, or, if its tool's declaration changed since, as the tool now is (the strictest of its
   effective class, which never falls below what an HTTP method says nor rests on an MCP server's
   annotations; the policies; an irreversible write's default wait unless its project waived it; propose
   mode): as many distinct approvals of exactly its arguments and its current declaration as the largest
   quorum, each from someone who may decide it when the call leaves (a project admin where any match
   said admins only), or
2. an allow rule stood in, and that rule was valid for that call: of the run's project, tool, run and
   agent, covering its arguments, not revoked nor expired, its creator not the run's starter and able to
   approve it alone (a quorum of one, an admin where admins only, an admin's mark for an irreversible call),
   and no propose mode;

and none of its approvers started its run; and no request a project's tool sends carries a secret value
that is not granted to that project. What the gate stored is at least as strict as the model.
"""

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agents.models import Agent
from approvals.services import approval_decide
from core.errors import WardenError
from policy.models import AllowRule, ApprovalPolicy, ApprovalRequest
from runs.models import Run
from runs.services import run_start
from runs.services.proposals import proposals_bundle_if_any
from saga.executor import run_operations
from tenancy.access import authorize, membership_grant, membership_revoke, role_of
from tenancy.models import Membership, Project
from tests.conftest import SQLITE, free_port, wait_for
from tests.runs.test_engine import scripted_workflow
from tools import broker
from tools.classifications import tool_classification_set
from tools.governance import declaration_save
from tools.http_tools import http_tool_problems
from tools.mcp_tools import mcp_tools_store
from tools.models import HttpTool, McpServer, SandboxCall, ToolClassification, ToolOperation

TOOLS = {  # Warden's registry: tool → (is a write, is irreversible)
    "email.send": (True, True),
    "tickets.create": (True, False),
    "crm.read": (False, False),
}
HTTP = "ext.call"  # each project's own HTTP tool (the same name in both: each is its project's only)
MCP = {"helpdesk.search_tickets": "search_tickets", "helpdesk.add_comment": "add_comment",
       "helpdesk.create_ticket": "create_ticket"}  # fmt: skip
ARGUMENTS = {
    "email.send": {"to": "a@customer.example", "subject": "Incident", "body": "We are on it."},
    "tickets.create": {"customer_id": "cust-a", "title": "Checkout down"},
    "crm.read": {"customer_id": "cust-a"},
    HTTP: {"customer_id": "cust-a"},
    "helpdesk.search_tickets": {"query": "down"},
    "helpdesk.add_comment": {"ticket_id": "TCK-1", "text": "on it"},
    "helpdesk.create_ticket": {"title": "Checkout down"},
}
CALLABLE = [*TOOLS, HTTP, *MCP]
CALLS = [*TOOLS, HTTP, HTTP, HTTP, *MCP, *MCP]  # what an agent calls: the projects' own tools more often
USERS = ["u0", "u1", "u2", "u3", "u4"]
ROLES = [None, "viewer", "operator", "reviewer", "admin"]
DECIDERS = ("reviewer", "admin")
READ, IDEM, NONIDEM = "read_only", "idempotent_write", "non_idempotent_write"
RANK = {READ: 0, IDEM: 1, NONIDEM: 2}
FLOORS = {"GET": READ, "HEAD": READ, "PUT": IDEM, "DELETE": IDEM, "POST": NONIDEM, "PATCH": NONIDEM}
# Secrets: each project's own, one granted to both, one set for nobody (a project may not name it).
SECRETS = {
    "GATE_SECRET_ALPHA": ["alpha"],
    "GATE_SECRET_BETA": ["beta"],
    "GATE_SECRET_SHARED": ["alpha", "beta"],
    "GATE_SECRET_NOBODYS": [],
}
OS = ToolOperation.Status
START = {"project": st.integers(0, 1), "starter": st.sampled_from([None, *USERS]), "propose": st.booleans()}
POLICY = {
    "project": st.sampled_from([None, 0, 1]),
    "tool": st.sampled_from(["", *CALLABLE]),
    "quorum": st.sampled_from([1, 1, 1, 2, 3]),
    "admins": st.sampled_from([False, False, False, True]),
    "enabled": st.sampled_from([True, True, False]),
}
ALLOW_RULE = {
    "creator": st.sampled_from(USERS),
    "project": st.integers(0, 1),
    "tool": st.sampled_from(CALLABLE),
    "scope": st.sampled_from(["project", "project", "run", "agent", "other agent"]),
    "covers": st.sampled_from([True, True, False]),
    "expired": st.sampled_from([False, False, False, False, True]),
    "exact": st.sampled_from([True, True, True, False]),
}
DECLARATION = {
    "project": st.integers(0, 1),
    "method": st.sampled_from(list(FLOORS)),
    "tool_class": st.sampled_from([READ, IDEM, NONIDEM]),
    "secret": st.sampled_from(list(SECRETS)),
    "direct": st.sampled_from([False, False, True]),  # written past the checks, as a bad migration might
}
ANNOTATIONS = st.sampled_from([{}, {"readOnlyHint": True}, {"idempotentHint": True}, {"destructiveHint": True}])


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
        self.needs: dict[str, tuple] = {}  # idempotency key → (need when judged, declaration then)
        self.verified: set[str] = set()
        self.declared: dict[tuple, tuple] = {}  # (project, tool) → what the model says the tool is now
        self.confirmed: dict[tuple, bool] = {}  # (project, MCP tool) → a project admin confirmed its class
        self.approved_for: dict[tuple, tuple] = {}  # (request, reviewer) → the declaration they approved

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
        # Examples share the test's database: each starts with no policy, rule or declaration, and its own
        # memberships.
        ApprovalPolicy.objects.all().delete()
        AllowRule.objects.all().delete()
        Membership.objects.all().delete()
        HttpTool.objects.all().delete()
        McpServer.objects.all().delete()
        ToolClassification.objects.all().delete()
        self.users = {u: type(self).people[u] for u in USERS}
        self.root = type(self).root
        self.projects = list(type(self).projects)
        self.agent_id = Agent.objects.get(slug=f"{self.workflow}-agent").id
        for n, role in enumerate(roles):
            if role is not None:
                membership_grant(
                    user=self.users[USERS[n % len(USERS)]], project=self.projects[n // len(USERS)], role=role
                )
        # Each project's own tools exist from the start (as declared at random); the rules edit them.
        for project in (0, 1):
            self.declare_http(
                project=project, **{k: data.draw(v, label=k) for k, v in DECLARATION.items() if k != "project"}
            )
            self.connect_mcp(project=project, annotations=data.draw(st.lists(ANNOTATIONS, min_size=3, max_size=3)))
            for tool in MCP:
                if data.draw(st.booleans(), label=f"{tool} confirmed"):
                    self.confirm_mcp(
                        project=project, tool=tool, tool_class=data.draw(st.sampled_from([READ, IDEM, NONIDEM]))
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

    @rule(project=st.integers(0, 1), tool=st.sampled_from(["", *CALLABLE]), enabled=st.sampled_from([True, False]))
    def add_waiver(self, project, tool, enabled):
        """Written straight to the table: a waiver lifts only the default wait of an irreversible write."""
        ApprovalPolicy.objects.create(
            name="w", effect="waive", project=self.projects[project], tool=tool, enabled=enabled
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

    # --- each project's own tools ------------------------------------------------------------------

    @rule(**DECLARATION)
    def declare_http(self, project, method, tool_class, secret, direct):
        """Declare (or change) the project's HTTP tool as its admins would (through the checks, a
        superuser's change applying at once), or write it straight to the table. A declaration below its
        method's floor, or naming a secret the project was not granted, is refused by the checks; one
        written past them is called as its floor, and its ungranted secret is refused at the call."""
        slug = self.projects[project].slug
        row = HttpTool.objects.filter(project=self.projects[project], name=HTTP).first() or HttpTool(
            project=self.projects[project], name=HTTP
        )
        row.method, row.tool_class = method, tool_class
        row.reversibility = "" if tool_class == READ else "irreversible"
        row.url = f"{type(self).sink.url}/{slug}/{method.lower()}/{len(self.declared)}"
        row.arguments_schema = {"type": "object", "properties": {"customer_id": {"type": "string"}}}
        row.headers = {"X-Secret": f"{{secret:{secret}}}"}
        row.idempotency_header = "Idempotency-Key"
        if direct:
            row.save()
        else:
            problems = dict(http_tool_problems(row))
            below = RANK[tool_class] < RANK[FLOORS[method]]
            assert ("tool_class" in problems) == below, (method, tool_class, problems)
            assert ("headers" in problems) == (slug not in SECRETS[secret]), (slug, secret, problems)
            if problems:
                event("declaration refused")
                return
            assert declaration_save(user=self.root, row=row, fields=["url", "method", "tool_class"]) is None
        called_as = max(tool_class, FLOORS[method], key=RANK.get)
        self.declared[(project, HTTP)] = ("http", row.url, method, tool_class, called_as, secret)

    @rule(project=st.integers(0, 1))
    def move_http(self, project):
        """The project's HTTP tool is pointed elsewhere (a second admin approved it, or a superuser did it):
        calls approved before must not follow it there unapproved."""
        row = HttpTool.objects.filter(project=self.projects[project], name=HTTP).first()
        if row is None or (project, HTTP) not in self.declared:
            return
        self.moves = getattr(self, "moves", 0) + 1
        row.url = f"{row.url.rsplit('/', 1)[0]}/moved-{self.moves}"
        assert declaration_save(user=self.root, row=row, fields=["url"]) is None
        self.declared[(project, HTTP)] = ("http", row.url, *self.declared[(project, HTTP)][2:])

    @rule(project=st.integers(0, 1), annotations=st.lists(ANNOTATIONS, min_size=3, max_size=3))
    def connect_mcp(self, project, annotations):
        """The project connects the MCP server; its tools arrive with the classes their annotations suggest
        (random here: what a listing stores), unclassified until the project confirms one."""
        server, _ = McpServer.objects.update_or_create(
            project=self.projects[project], name="helpdesk",
            defaults={"transport": "http", "url": type(self).mcp_url, "timeout_seconds": 20},
        )  # fmt: skip
        listed = [
            {"remote_name": remote, "description": "", "annotations": notes,
             "input_schema": {"type": "object", "properties": {k: {"type": "string"} for k in ARGUMENTS[name]}}}
            for (name, remote), notes in zip(MCP.items(), annotations, strict=True)
        ]  # fmt: skip
        mcp_tools_store(server, listed)
        for name in MCP:
            confirmed = ToolClassification.objects.filter(project=self.projects[project], tool=name).first()
            # What a call is: the confirmed class, or the most dangerous one (an approval given for the
            # tool unconfirmed stands for that class); whether it is confirmed is said apart.
            self.declared[(project, name)] = ("mcp", confirmed.tool_class if confirmed else NONIDEM)
            self.confirmed[(project, name)] = confirmed is not None

    @rule(project=st.integers(0, 1), tool=st.sampled_from(list(MCP)), tool_class=st.sampled_from([READ, IDEM, NONIDEM]))
    def confirm_mcp(self, project, tool, tool_class):
        """A superuser confirms a class (at once, whatever the suggestion; a project admin's loosening
        would wait for a second admin: tests/approvals/test_governance.py)."""
        if (project, tool) not in self.declared:
            return
        tool_classification_set(user=self.root, project=self.projects[project], tool=tool, tool_class=tool_class,
                                reversibility="" if tool_class == READ else "irreversible")  # fmt: skip
        self.declared[(project, tool)] = ("mcp", tool_class)
        self.confirmed[(project, tool)] = True

    @rule(**START)
    def start(self, project, starter, propose):
        user = self.users[starter] if starter else None
        run = run_start(
            workflow=self.workflow,
            project=self.projects[project],
            started_by=user,
            input={"propose_tools": ["email.send", "tickets.create"]} if propose else {},
        )
        # A waiver loosens: it lifts a run's default review only if it was in force when the run started.
        waivers = set(ApprovalPolicy.objects.filter(enabled=True, effect="waive").values_list("id", flat=True))
        self.runs[run.id] = {
            "project": project,
            "starter": user.pk if user else None,
            "propose": propose,
            "step": 0,
            "waivers": waivers,
        }

    # --- calls, decisions, executions --------------------------------------------------------------

    def callable_runs(self):
        return sorted(r for r, f in self.runs.items() if not f.get("bundled"))

    @precondition(lambda self: self.callable_runs())
    @rule(data=st.data(), tool=st.sampled_from(CALLS), last=st.booleans())
    def call(self, data, tool, last):
        """The run's agent calls a tool. In propose mode, its last call ends its work: what it proposed is
        bundled for one approval, as the end of a run's tasks does."""
        run_id = data.draw(st.sampled_from(self.callable_runs()), label="run")
        facts = self.runs[run_id]
        facts["step"] += 1
        run = Run.objects.get(id=run_id)
        task = run.tasks.get()
        key = broker.idempotency_key(run_id=run_id, task_key=task.key, step=facts["step"])
        self.needs[key] = (self.need(run, tool), self.declared.get((facts["project"], tool)))
        self._deliver(run, task, facts["step"], tool)
        if facts["propose"] and last:
            facts["bundled"] = True
            with transaction.atomic():
                locked = Run.objects.select_for_update().get(id=run_id)
                if locked.status == Run.Status.RUNNING:
                    proposals_bundle_if_any(locked, timezone.now())

    @precondition(lambda self: self.callable_runs())
    @rule(data=st.data(), tool=st.sampled_from(CALLS), last=st.booleans())
    def another_call(self, data, tool, last):
        """(The same as ``call``: calls are what the invariant is about, so they come twice as often.)"""
        self.call(data, tool, last)

    def _deliver(self, run, task, step, tool):
        try:
            broker.tool_call(run=run, task=task, step=step, call_number=step, name=tool, arguments=ARGUMENTS[tool])
        except broker.TaskParked:
            pass
        except WardenError:
            pass  # a rejection that fails the task, a refused secret, an unreachable tool: not the subject here

    def pending(self):
        return ApprovalRequest.objects.filter(status="pending", run_id__in=list(self.runs))

    @precondition(lambda self: self.runs and self.pending().exists())
    @rule(
        data=st.data(),
        approve=st.sampled_from([True, True, True, False]),
        wake=st.booleans(),
        edit=st.sampled_from([False, False, True]),
    )
    def decide(self, data, approve, wake, edit):
        """Someone decides a pending request (as the API, the queue and the admin do: the role first, then
        the service), and what the decision wakes goes on (or, ``wake`` false, only later): the parked
        agent asks the broker again, the supervisor's executor runs what its bundle's reviewers approved.
        ``edit``: the decided call's tool changes between the yes and the call (it is pointed elsewhere,
        or confirmed as another class)."""
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
        project = self.runs[request.run_id]["project"]
        for op in ToolOperation.objects.filter(approval__in=[request.id, *request.items.values_list("id", flat=True)]):
            self.approved_for[(op.approval_id, user.pk)] = self.declared.get((project, op.tool))
            if edit and op.tool == HTTP:
                self.move_http(project)
            elif edit and op.tool in MCP:
                other = data.draw(st.sampled_from([READ, IDEM, NONIDEM]), label="confirmed as")
                self.confirm_mcp(project=project, tool=op.tool, tool_class=other)
        if wake:
            self.wake(request.run_id)

    def asleep(self):
        return ToolOperation.objects.filter(run_id__in=list(self.runs), status=OS.APPROVED).exists()

    @precondition(lambda self: self.runs and self.asleep())
    @rule(data=st.data())
    def wake_later(self, data):
        """What an earlier decision woke goes on now (its outbox message arrived late)."""
        runs = ToolOperation.objects.filter(run_id__in=list(self.runs), status=OS.APPROVED)
        self.wake(data.draw(st.sampled_from(sorted(set(runs.values_list("run_id", flat=True))))))

    def wake(self, run_id: int):
        for op in ToolOperation.objects.filter(run_id=run_id, proposed=False).exclude(
            status__in=[OS.COMMITTED, OS.AWAITING_APPROVAL]
        ):
            self._deliver(op.run, op.task, op.step, op.tool)
        run_operations(run_id)

    # --- the model ---------------------------------------------------------------------------------

    def what(self, project: int, tool: str) -> tuple[bool, bool, bool]:
        """(classified, write, irreversible) of a tool in a project, as the model says it is now."""
        if tool in TOOLS:
            return True, *TOOLS[tool]
        declared = self.declared.get((project, tool))
        if declared is None or declared[0] == "mcp" and not self.confirmed[(project, tool)]:
            return False, True, True  # unknown (no call is made) or unconfirmed: the most dangerous class
        tool_class = declared[4] if declared[0] == "http" else declared[1]
        return True, tool_class != READ, tool_class != READ  # no undo: a declared write is irreversible

    def need(self, run: Run, tool: str) -> Need:
        facts = self.runs[run.id]
        classified, write, irreversible = self.what(facts["project"], tool)
        propose = facts["propose"] and tool in ("email.send", "tickets.create")
        matched = [
            p
            for p in ApprovalPolicy.objects.filter(enabled=True, effect="require")
            if (p.project_id in (None, run.project_id))
            and (p.workflow_id in (None, run.workflow_id))
            and (p.tool == tool or (p.tool == "" and write))
        ]
        waived = ApprovalPolicy.objects.filter(
            enabled=True, effect="waive", project_id=run.project_id, tool__in=[tool, ""], id__in=facts["waivers"]
        ).exists()
        by_default = write and irreversible and not waived
        if not matched and not propose and classified and not by_default:
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

    def left(self) -> set[str]:
        """The keys of the calls that reached a system: the sandbox's, the HTTP service's, the MCP server's."""
        sandbox = SandboxCall.objects.filter(idempotency_key__in=list(self.needs))
        keys = set(sandbox.values_list("idempotency_key", flat=True))
        keys |= {r["key"] for r in type(self).sink.requests}
        keys |= {c["key"] for c in type(self).mcp_calls()}
        return (keys & set(self.needs)) - self.verified

    @invariant()
    def nothing_leaves_without_the_yes_it_needs(self):
        for key in self.left():
            op = ToolOperation.objects.select_related("run", "approval").get(idempotency_key=key)
            facts, verdict = self.runs[op.run_id], op.verdict
            judged, declared_then = self.needs[key]
            declared_now = self.declared.get((facts["project"], op.tool))
            # Judged again when its tool changed: what the gate asks for now is what must be satisfied.
            need = judged if declared_now == declared_then else self.need(op.run, op.tool)
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
                    # An approval stands for the tool as it was approved: an edit since voids it.
                    approvers = {u for u in approvers if self.approved_for.get((op.approval_id, u)) == declared_now}
                    eligible = ("admin",) if need.admins_only else DECIDERS
                    deciders = [u for u in approvers if role_of(self._user(u), op.run.project_id) in eligible]
                    assert len(deciders) >= need.quorum, (key, need, approvers, declared_then, declared_now)
            self.verified.add(key)

    @invariant()
    def no_request_carries_a_secret_not_granted_to_its_project(self):
        values = type(self).secret_values
        for request in type(self).sink.requests[type(self).sink.checked :]:
            project = request["path"].split("/")[1]
            allowed = {values[name] for name, slugs in SECRETS.items() if project in slugs}
            assert request["secret"] in allowed, (project, request["path"])
        type(self).sink.checked = len(type(self).sink.requests)

    def _user(self, pk):
        return next(u for u in self.users.values() if u.pk == pk)


class Sink:
    """A real HTTP service on 127.0.0.1 for the projects' HTTP tools: it answers every request and keeps,
    for the test, the path, the idempotency key and the secret header it received."""

    def __init__(self):
        self.requests: list[dict] = []
        self.checked = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                sink.requests.append(
                    {"path": self.path, "key": self.headers.get("Idempotency-Key", ""),
                     "secret": self.headers.get("X-Secret", "")}
                )  # fmt: skip
                body = json.dumps({"ok": True}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


EXAMPLE_MCP = Path(__file__).resolve().parents[2] / "examples" / "refunds" / "tickets_mcp.py"


@pytest.fixture
def gate_machine(demo, django_user_model, monkeypatch, settings, tmp_path):
    scripted_workflow(GateMachine.workflow, [{"final": {}}], tools=CALLABLE)
    GateMachine.people = {u: django_user_model.objects.create_user(username=u, password=f"{u}-pass-123") for u in USERS}
    GateMachine.root = django_user_model.objects.create_superuser("gate-root", "root@example.com", "root-pass-123")
    GateMachine.projects = [
        Project.objects.create(slug="alpha", name="Alpha"),
        Project.objects.create(slug="beta", name="Beta"),
    ]
    GateMachine.secret_values = {name: f"{name.lower()}-value-{os.getpid()}" for name in SECRETS}
    for name, value in GateMachine.secret_values.items():
        monkeypatch.setenv(name, value)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {k: v for k, v in SECRETS.items() if v}}
    GateMachine.sink = Sink()
    calls = tmp_path / "mcp-calls.jsonl"
    port = free_port()
    server = subprocess.Popen([sys.executable, str(EXAMPLE_MCP), "--http", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "TICKETS_CALLS": str(calls)})  # fmt: skip
    GateMachine.mcp_url = f"http://127.0.0.1:{port}/mcp"
    GateMachine.mcp_calls = staticmethod(
        lambda: [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    )
    wait_for(lambda: _answers(port), timeout=30, interval=0.2, message="the MCP server to listen")
    monkeypatch.setattr("runs.heartbeat.lease_keeper.hold_executor", lambda run_id, token: None)
    broker.circuit_reset()
    yield GateMachine
    broker.circuit_reset()
    server.kill()
    server.wait()
    GateMachine.sink.stop()


def _answers(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


# 300 examples take one to three minutes beside the other half of the suite; the default 300 s is for a hang.
@pytest.mark.timeout(900)
def test_nothing_leaves_without_the_right_peoples_yes(gate_machine):
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        gate_machine,
        settings=settings(
            # 300 in embedded mode (WARDEN_GATE_EXAMPLES=2000 for a deep run); scaled mode, several times
            # slower per example, runs 60 of the same.
            max_examples=int(os.environ.get("WARDEN_GATE_EXAMPLES", 300 if SQLITE else 60)),
            stateful_step_count=20,
            deadline=None,
            database=None,  # examples hold ids of a rolled-back test database: nothing worth replaying
            derandomize=os.environ.get("WARDEN_REQUIRE_SERVICES") == "1",  # CI: one fixed, reproducible set
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )

"""The gate's matching and verdicts: from the facts of one call (its run, its tool's class, where it comes
from), what every rule that matches asks of it, and the strictest of them.

tools/gate.py gathers the facts (the tool's classification and declaration, the run's workflow and project)
and asks ``judge``; just before a call leaves, ``approval_refusal`` says whether the decisions recorded on
its approval request satisfy the verdict. The lattice is in docs/access.md.
"""

from dataclasses import asdict, dataclass, fields, replace

from django.db.models import Q
from django.utils import timezone

from tenancy.access import role_of

from .classes import Reversibility, ToolClass, stricter_class, stricter_reversibility
from .deciders import Refusal, decider_refusal
from .models import AllowRule, ApprovalPolicy, ApprovalRequest

ALLOW, APPROVAL, REFUSE = "allow", "approval", "refuse"
_DECISION_RANK = {ALLOW: 0, APPROVAL: 1, REFUSE: 2}


class Origin:
    AGENT = "agent"  # a Warden agent's tool call
    PROPOSAL = "proposal"  # propose mode: the supervisor executes it after a reviewer's yes
    COMPENSATION = "compensation"  # the undo of a reversible effect
    CORRECTION = "correction"  # what follows an irreversible effect (a correction e-mail)
    EXTERNAL = "external"  # an agent that runs elsewhere, through the API
    # Where a standing allow rule may stand in for its creator's approval: an agent's own calls.
    RULES_APPLY = frozenset({AGENT, EXTERNAL})


@dataclass(frozen=True)
class Classification:
    tool_class: str
    reversibility: str
    source: str  # registry, project, unclassified
    approval: str = ""  # the project's word: "", "always" or "refuse"

    @property
    def is_write(self) -> bool:
        return self.tool_class != ToolClass.READ_ONLY


@dataclass(frozen=True)
class Verdict:
    """What the gate decided for one call, and why. Stored on the operation as JSON."""

    decision: str  # allow, approval, refuse
    tool_class: str
    reversibility: str
    classified_by: str
    quorum: int = 0  # approvals from distinct reviewers it needs (when it waits)
    admins_only: bool = False
    expires_after: int | None = None  # seconds; the soonest any match asked for
    expiry_policy: int | None = None  # the approval policy that set it (its on_expiry and reminder apply)
    fail_on_reject: bool = False
    policies: tuple = ()  # approval policies that matched
    allow_rule: int | None = None  # the allow rule that stood in for a reviewer
    waiver: int | None = None  # the waiver that let an irreversible call leave without a reviewer
    reasons: tuple = ()

    def to_json(self) -> dict:
        data = asdict(self)
        data["policies"], data["reasons"] = list(self.policies), list(self.reasons)
        return data

    @classmethod
    def from_json(cls, data: dict | None) -> "Verdict":
        data = data or {}
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values.setdefault("decision", APPROVAL)  # a verdict that cannot be read is read as the stricter one
        values.setdefault("tool_class", ToolClass.NON_IDEMPOTENT_WRITE)
        values.setdefault("reversibility", Reversibility.IRREVERSIBLE)
        values.setdefault("classified_by", "unknown")
        values["policies"] = tuple(values.get("policies") or ())
        values["reasons"] = tuple(values.get("reasons") or ())
        return cls(**values)

    @property
    def waits(self) -> bool:
        return self.decision == APPROVAL

    def summary(self) -> str:
        """One line for the ledger and the approval card."""
        if self.decision == REFUSE:
            head = "refused"
        elif self.decision == ALLOW:
            head = f"allowed by allow rule {self.allow_rule}" if self.allow_rule else "allowed"
            head += f" (irreversible, waived by policy {self.waiver})" if self.waiver else ""
        else:
            who = "project admins" if self.admins_only else "reviewers"
            head = f"waits for {max(1, self.quorum)} of the project's {who}"
            if self.expires_after:
                head += f", within {self.expires_after} s"
            if self.fail_on_reject:
                head += "; a rejection fails the task"
        return f"{head} — {'; '.join(self.reasons)}" if self.reasons else head


def strictest(verdicts) -> Verdict:
    """The strictest of several verdicts on each point: a bundle's request, an edited call."""
    verdicts = list(verdicts)
    top = max(verdicts, key=lambda v: _DECISION_RANK[v.decision])
    expiring = [v for v in verdicts if v.expires_after]
    soonest = min(expiring, key=lambda v: v.expires_after) if expiring else None
    reasons = tuple(dict.fromkeys(r for v in verdicts for r in v.reasons))
    return replace(
        top,
        quorum=max(v.quorum for v in verdicts),
        admins_only=any(v.admins_only for v in verdicts),
        expires_after=soonest.expires_after if soonest else None,
        expiry_policy=soonest.expiry_policy if soonest else None,
        fail_on_reject=any(v.fail_on_reject for v in verdicts),
        policies=tuple(sorted({p for v in verdicts for p in v.policies})),
        allow_rule=top.allow_rule if top.decision == ALLOW else None,
        waiver=top.waiver if top.decision == ALLOW else None,
        tool_class=stricter_class(*(v.tool_class for v in verdicts)),
        reversibility=stricter_reversibility(*(v.reversibility for v in verdicts)),
        reasons=reasons,
    )


@dataclass(frozen=True)
class Need:
    """One thing that matched the call and what it asks for."""

    reason: str
    quorum: int = 1
    admins_only: bool = False
    expires_after: int | None = None
    policy: int | None = None
    fail_on_reject: bool = False
    refuse: bool = False


@dataclass(frozen=True)
class RunFacts:
    run_id: int
    project_id: int
    project: str
    workflow_id: int
    workflow: str
    tool_policies: dict
    started_by_id: int | None
    # The approval policies in force when the run started, with their settings (policy/services.py, policies_in_force);
    # None for a run started before they were recorded: the live ones alone apply to it.
    recorded_policies: list | None = None
    # Whether an enabled approval policy of this run's scope (a waiver of its project) names the tool or
    # every tool: the policies themselves are loaded only when one might match (most calls match none).
    policies_may_match: bool = True
    waivers_may_match: bool = True


def _irreversible_needs(facts: RunFacts, tool: str, arguments: dict, found: Classification, origin: str):
    """An irreversible write waits for one reviewer of its project unless the project waived that for it
    (a waiver: an approval policy with effect "waive", made by the project's admins). Returns the need
    (or none) and the waiver that lifted it. A compensation's undo restores what its run did and is
    judged by the policies alone; an unclassified tool waits anyway."""
    if (
        not found.is_write
        or found.reversibility != Reversibility.IRREVERSIBLE
        or found.source == "unclassified"
        or origin == Origin.COMPENSATION
    ):
        return [], None
    waiver = _waiver(facts, tool, arguments) if facts.waivers_may_match else None
    if waiver is not None:
        return [], waiver
    why = f"{tool} is irreversible: it waits for a reviewer unless project {facts.project} waives that"
    return [Need(why)], None


def _waiver(facts: RunFacts, tool: str, arguments: dict) -> ApprovalPolicy | None:
    """The first enabled waiver of the run's project (and workflow) whose tool and condition match. A
    waiver whose condition cannot be evaluated waives nothing."""
    rows = (
        ApprovalPolicy.objects.filter(Q(tool=tool) | Q(tool=""), enabled=True, effect=ApprovalPolicy.Effect.WAIVE)
        .filter(project_id=facts.project_id)
        .filter(Q(workflow__isnull=True) | Q(workflow_id=facts.workflow_id))
        .order_by("id")
    )
    return next(
        (
            rule
            for rule in rows
            if rule.waives(tool=tool, arguments=arguments) and _waived_at_start(facts, rule, tool, arguments)
        ),
        None,
    )


def _waived_at_start(facts: RunFacts, rule: ApprovalPolicy, tool: str, arguments: dict) -> bool:
    """A waiver loosens: it lifts a run's default only if it was in force when the run started and, as
    then recorded, covers the call too (a waiver added or widened since reaches only new runs). A run
    started before policies were recorded with their settings takes the live waiver, as it always did."""
    if facts.recorded_policies is None:
        return True
    entry = next((e for e in facts.recorded_policies if isinstance(e, dict) and e.get("id") == rule.id), None)
    if entry is None:
        return False
    then = ApprovalPolicy.as_recorded(entry)
    return then is None or then.waives(tool=tool, arguments=arguments)


def _workflow_needs(facts: RunFacts, tool: str, origin: str, corrects: str) -> list[Need]:
    needs = []
    if origin == Origin.CORRECTION:
        original = facts.tool_policies.get(corrects) or {}
        if not isinstance(original, dict) or original.get("correction_approval", "always") != "never":
            needs.append(Need(f"a correction of {corrects or 'an irreversible effect'} waits for a reviewer"))
    policy = facts.tool_policies.get(tool) or {}
    if isinstance(policy, dict) and policy.get("approval") == "always":
        expires = policy.get("expires_after")
        needs.append(
            Need(
                f"workflow {facts.workflow}: every {tool} waits for a reviewer",
                quorum=max(1, int(policy.get("quorum") or 1)),
                admins_only=bool(policy.get("admins_only")),
                expires_after=int(expires) if expires else None,
                fail_on_reject=policy.get("on_reject") == ApprovalPolicy.OnReject.FAIL_TASK,
            )
        )
    return needs


def _policy_needs(facts: RunFacts, tool: str, arguments: dict, is_write: bool) -> list[Need]:
    # A policy for "every tool" (tool left empty) covers writes; one that names a read covers that read.
    tools = Q(tool=tool) | Q(tool="") if is_write else Q(tool=tool)
    rules = (
        ApprovalPolicy.objects.filter(tools, enabled=True, effect=ApprovalPolicy.Effect.REQUIRE)
        .filter(Q(project__isnull=True) | Q(project_id=facts.project_id))
        .filter(Q(workflow__isnull=True) | Q(workflow_id=facts.workflow_id))
        .order_by("id")
    )
    return [
        _policy_need(rule, why=f"policy {rule.id} {rule.name!r}")
        for rule in rules
        if rule.matches(tool=tool, arguments=arguments)
    ]


def _recorded_needs(facts: RunFacts, tool: str, arguments: dict, is_write: bool) -> list[Need]:
    """What the policies in force at the run's start ask of the call, as they were then: a policy loosened,
    disabled or deleted since still binds the runs already in flight (a tightening binds them at once,
    through the live rows: ``_policy_needs``)."""
    needs = []
    for entry in facts.recorded_policies or ():
        rule = ApprovalPolicy.as_recorded(entry)
        if rule is None or rule.effect != ApprovalPolicy.Effect.REQUIRE or (not rule.tool and not is_write):
            continue
        if rule.matches(tool=tool, arguments=arguments):
            needs.append(_policy_need(rule, why=f"policy {rule.id} {rule.name!r} as it was when the run started"))
    return needs


def _policy_need(rule: ApprovalPolicy, *, why: str) -> Need:
    return Need(
        why,
        quorum=max(1, rule.quorum or 1),
        admins_only=rule.decided_by_role == "admin",
        expires_after=rule.expires_after_seconds,
        policy=rule.id,
        fail_on_reject=rule.on_reject == ApprovalPolicy.OnReject.FAIL_TASK,
    )


def _verdict(found: Classification, needs: list[Need]) -> Verdict:
    base = {"tool_class": found.tool_class, "reversibility": found.reversibility, "classified_by": found.source}
    refusals = [n.reason for n in needs if n.refuse]
    if refusals:
        return Verdict(REFUSE, **base, reasons=tuple(refusals))
    if not needs:
        return Verdict(ALLOW, **base, reasons=("no policy asks for a review",))
    expiring = [n for n in needs if n.expires_after]
    soonest = min(expiring, key=lambda n: n.expires_after) if expiring else None
    return Verdict(
        APPROVAL,
        **base,
        quorum=max(n.quorum for n in needs),
        admins_only=any(n.admins_only for n in needs),
        expires_after=soonest.expires_after if soonest else None,
        expiry_policy=soonest.policy if soonest else None,
        fail_on_reject=any(n.fail_on_reject for n in needs),
        policies=tuple(sorted({n.policy for n in needs if n.policy})),
        reasons=tuple(n.reason for n in needs),
    )


def allow_rule_refusal(rule: AllowRule, *, verdict: Verdict, started_by_id: int | None, project_id: int) -> str:
    """Why this rule may not stand in for a reviewer on a call with this verdict ('' when it may). A rule
    waives only what its creator could have approved alone, as things stand now (the decider rule)."""
    role = role_of(rule.created_by, project_id)
    refusal = decider_refusal(rule.created_by, project_id=project_id, started_by_id=started_by_id, role=role)
    if refusal == Refusal.STARTED_THE_RUN:
        return "its creator started this run (separation of duties)"
    if refusal:
        return "its creator may no longer decide in this project"
    if verdict.quorum > 1:
        return f"the call needs {verdict.quorum} reviewers and a rule stands for its creator alone"
    admin = role == "admin"
    if verdict.admins_only and not admin:
        return "only a project admin may decide this call"
    if verdict.reversibility == Reversibility.IRREVERSIBLE and not (rule.covers_irreversible and admin):
        return (
            "the call is irreversible: only a rule a project admin marked as covering irreversible calls may allow it"
        )
    return ""


def _allow_rule(verdict: Verdict, facts: RunFacts, tool: str, arguments: dict, agent_id: int | None) -> Verdict:
    rules = (
        AllowRule.objects.filter(project_id=facts.project_id, tool=tool, revoked_at__isnull=True)
        .filter(expires_at__gt=timezone.now())
        .filter(Q(run__isnull=True) | Q(run_id=facts.run_id))
        .filter(Q(agent__isnull=True) | Q(agent_id=agent_id))
        .select_related("created_by")
        .order_by("id")
    )
    notes = []
    for rule in rules:
        if not rule.covers(arguments=arguments):
            continue
        why = allow_rule_refusal(rule, verdict=verdict, started_by_id=facts.started_by_id, project_id=facts.project_id)
        if why:
            notes.append(f"allow rule {rule.id} not used: {why}")
            continue
        used = f"allow rule {rule.id} by {rule.created_by.get_username()} stands in for its creator's approval"
        return replace(verdict, decision=ALLOW, allow_rule=rule.id, reasons=(*verdict.reasons, *notes, used))
    return replace(verdict, reasons=(*verdict.reasons, *notes)) if notes else verdict


def judge(
    *, facts: RunFacts, found: Classification, tool: str, arguments: dict, origin: str, tool_needs=(),
    agent_id: int | None = None, corrects: str = "", repeats: int | None = None,
) -> Verdict:  # fmt: skip
    """The verdict on one call, from its facts: ``found`` the tool's classification and ``tool_needs``
    what its tool and task ask already (an allowlist, a project's word on the tool), both gathered by the
    gate (tools/gate.py); then the irreversible default and its waivers, the workflow's tool policies,
    the approval policies (live and as recorded at the run's start), propose mode, a repeated effect,
    and last a standing allow rule."""
    needs = list(tool_needs)
    default, waiver = _irreversible_needs(facts, tool, arguments, found, origin)
    needs += default
    needs += _workflow_needs(facts, tool, origin, corrects)
    live = _policy_needs(facts, tool, arguments, found.is_write) if facts.policies_may_match else []
    same = {replace(n, reason="") for n in live}  # a policy unchanged since the start asks once
    needs += live + [
        n for n in _recorded_needs(facts, tool, arguments, found.is_write) if replace(n, reason="") not in same
    ]
    if origin == Origin.PROPOSAL:
        needs.append(Need("propose mode: a reviewer approves it before the supervisor executes it"))
    if repeats is not None:
        needs.append(Need(f"it repeats committed operation {repeats}: each repeated effect is approved on its own"))
    verdict = _verdict(found, needs)
    if waiver is not None:
        note = f"irreversible, and policy {waiver.id} {waiver.name!r} lets it leave without a reviewer"
        reasons = (note,) if verdict.decision == ALLOW else (*verdict.reasons, note)
        verdict = replace(verdict, waiver=waiver.id, reasons=reasons)
    # A standing rule allows calls, not second effects: a repeat is always a person's decision.
    if verdict.decision == APPROVAL and origin in Origin.RULES_APPLY and repeats is None:
        verdict = _allow_rule(verdict, facts, tool, arguments, agent_id)
    return verdict


def approval_refusal(op) -> str:
    """Just before the operation's call leaves: '' when the decisions recorded on it satisfy its verdict,
    else why not. An operation that waits needs its approval request approved, for exactly its current
    arguments, by as many distinct reviewers as the verdict asks, each of whom may still decide it (the
    decider rule: the role it needs in the run's project, and none of them whoever started the run or
    asked for the work)."""
    verdict = Verdict.from_json(op.verdict)
    if op.gate == ALLOW and verdict.decision == ALLOW:
        return ""
    if verdict.decision == REFUSE:
        return "the gate refused it"
    request = ApprovalRequest.objects.filter(id=op.approval_id).first() if op.approval_id else None
    if request is None:
        return "it needs a reviewer's approval and has none"
    if request.status != ApprovalRequest.Status.APPROVED:
        return f"its approval request is {request.status}"
    if request.arguments_hash != op.arguments_hash:
        return "the arguments differ from those approved"
    if (request.declaration or "") != (op.declaration or ""):
        return "its tool's declaration changed since it was approved"
    project_id, started_by = (
        ApprovalRequest.objects.filter(id=request.id).values_list("run__project_id", "run__started_by_id").get()
    )
    decisions = request.decisions.filter(verdict="approve", arguments_hash=op.arguments_hash).select_related("reviewer")
    approvers = {
        d.reviewer_id
        for d in decisions
        if not decider_refusal(
            d.reviewer,
            project_id=project_id,
            started_by_id=started_by,
            requested_by_id=request.requested_by_id,
            admins_only=verdict.admins_only,
        )  # fmt: skip
    }
    needed = max(1, verdict.quorum)
    if len(approvers) < needed:
        return (
            f"the approving reviewers may no longer decide in this project: {len(approvers)} of the {needed} "
            "approvals it needs still count"
        )
    return ""

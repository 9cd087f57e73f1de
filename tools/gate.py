"""The gate: the one place that decides whether an outbound call may leave now, after whose yes, or never.

Every path that writes a ledger operation asks ``gate`` first and stores its verdict on the row
(``tools.ledger.operation_record``): an agent's tool call, a proposal (propose mode), an undo or a
correction of a compensation, an external agent's intent. Retries, retry-from, forks, admin and bulk actions
reach the outside world only through those paths (a fork's inherited receipts are copies, verdicts included,
never called). The database refuses an operation without a verdict.

The verdict is the strictest of everything that matches the call:

- the tool's classification: Warden's registry, else the project's (a project admin's word), else the
  most dangerous class, a non-idempotent irreversible write, which waits for a reviewer;
- the workflow's trusted tool policies;
- every enabled approval policy of the run's project (or of all projects) and its workflow (or all)
  whose tool and condition match;
- where the call comes from: a proposal waits for a reviewer (propose mode asks for one), and so does a
  correction unless the workflow says its corrections need none.

What a caller supplies can only raise it: a run's input (propose mode), the class an agent claims for its
tool. The one thing that turns "wait for a reviewer" into "allow" is a standing allow rule, and only one
its creator could have approved alone (``allow_rule_refusal``). The lattice is in docs/access.md.

Just before a call leaves, ``gate_satisfied`` asks whether the decisions recorded on the operation
satisfy its verdict: enough distinct reviewers who still hold the role it needs, none of them whoever
started the run or asked for the work, each of them approving exactly these arguments.

This module gathers the facts of a call (what the tool is, the run's project and workflow); the rules
that judge them, and the verdict's shape, are the policy app's (policy/verdicts.py, policy/deciders.py).
"""

from dataclasses import replace

from core import hooks
from policy.classes import stricter_class, stricter_reversibility
from policy.verdicts import (  # noqa: F401  (the verdict's names, read by the broker, the engine and the pages)
    ALLOW,
    APPROVAL,
    REFUSE,
    Classification,
    Need,
    Origin,
    RunFacts,
    Verdict,
    allow_rule_refusal,
    approval_refusal,
    judge,
    strictest,
)

from .catalog import tool_spec
from .models import ToolClassification
from .registry import Reversibility, ToolClass


def tool_classify(*, project_id: int, tool: str, claimed_class: str = "", claimed_reversibility: str = ""):
    """What the tool does: Warden's registry; else a declared tool's effective class (its declaration, or
    for an MCP tool the class a project admin confirmed: tools/catalog.py); else the project's
    classification; else the most dangerous class. A claim (an external agent's ``tool_class``) is only
    taken where it is stricter."""
    spec = tool_spec(tool, project_id)
    if spec is not None and spec.project_id is None:
        found = Classification(spec.tool_class, spec.reversibility, "registry")
    elif spec is not None:
        found = Classification(
            spec.tool_class, spec.reversibility, spec.kind if spec.classified else "unclassified", spec.approval
        )
    else:
        row = (
            ToolClassification.objects.filter(project_id=project_id, tool=tool)
            .values_list("tool_class", "reversibility", "approval")
            .first()
        )
        if row is not None:
            found = Classification(row[0], row[1], "project", row[2])
        else:
            found = Classification(ToolClass.NON_IDEMPOTENT_WRITE, Reversibility.IRREVERSIBLE, "unclassified")
    tool_class = stricter_class(found.tool_class, claimed_class)
    reversibility = stricter_reversibility(found.reversibility, claimed_reversibility)
    if tool_class != ToolClass.READ_ONLY and not reversibility:
        reversibility = Reversibility.IRREVERSIBLE  # a write nobody says can be undone cannot be
    return replace(found, tool_class=tool_class, reversibility=reversibility)


def gate(
    *,
    run_id: int,
    tool: str,
    arguments: dict,
    origin: str,
    agent_id: int | None = None,
    allowed_tools=None,
    claimed_class: str = "",
    claimed_reversibility: str = "",
    corrects: str = "",
    repeats: int | None = None,
    facts: RunFacts | None = None,
) -> Verdict:
    """The verdict on one call of ``tool`` with these (validated) ``arguments`` in run ``run_id``.
    ``allowed_tools``: the task's allowlist (trusted configuration), for an agent's call; ``corrects``:
    the tool whose effect a correction follows; ``repeats``: the committed operation this call makes
    happen again (chosen at a retry from an earlier step), which a reviewer approves first. ``facts``: the
    run's (runs.selectors.run_gate_facts for this run and tool), when the caller has them."""
    if facts is None:  # the run's own facts are the engine's: asked of it, never read from its tables here
        facts = hooks.call(hooks.RUN_GATE_FACTS, run_id=run_id, tool=tool)
    found = tool_classify(
        project_id=facts.project_id,
        tool=tool,
        claimed_class=claimed_class,
        claimed_reversibility=claimed_reversibility,
    )
    needs: list[Need] = []
    if allowed_tools is not None and tool not in allowed_tools:
        needs.append(Need(f"{tool} is not on this task's allowlist", refuse=True))
    if found.approval == ToolClassification.Approval.REFUSE:
        needs.append(Need(f"project {facts.project} never allows {tool}", refuse=True))
    if found.source == "unclassified":
        needs.append(
            Need(
                f"nobody has classified {tool} in project {facts.project}: it is treated as a non-idempotent, "
                "irreversible write until a project admin does"
            )
        )
    if found.approval == ToolClassification.Approval.ALWAYS:
        needs.append(Need(f"project {facts.project}: every call of {tool} waits for a reviewer"))
    return judge(
        facts=facts,
        found=found,
        tool=tool,
        arguments=arguments,
        origin=origin,
        tool_needs=needs,
        agent_id=agent_id,
        corrects=corrects,
        repeats=repeats,
    )


def gate_satisfied(op) -> str:
    """Just before the operation's call leaves: '' when the decisions recorded on it satisfy its verdict,
    else why not (policy/verdicts.py, ``approval_refusal``)."""
    return approval_refusal(op)

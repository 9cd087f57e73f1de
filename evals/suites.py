"""Starting a suite, judging its cases as their runs end, the regressions against a baseline pass, the
suites a new version starts, and cases made from annotated runs."""

import logging

from django.db import transaction

from agents.models import AgentVersion, Workflow, WorkflowVersion
from agents.selectors import workflow_visible
from core import bus
from core.errors import InvalidInput
from policy.models import ApprovalPolicy
from runs.models import Run
from runs.services import run_start, sql
from runs.services.outbox import outbox_add
from tenancy.audit import audit

from .checks import check_failures, checks_refusal, judges
from .models import Annotation, EvalCase, EvalResult, EvalRun, EvalSuite

log = logging.getLogger("warden.evals")
GRADE = "grade_eval_result"  # the actor that asks the judges (evals/actors.py)


def eval_start(
    *, suite: EvalSuite, version=None, user=None, baseline: bool = False, via: str = "page", trigger: str = ""
) -> EvalRun:
    """Start every case of the suite (with ``baseline``, every case that has a baseline workflow, on it),
    as runs of the suite's project; their results fill in as they end. Writes its audit row."""
    cases = list(suite.cases.select_related("workflow", "baseline_workflow"))
    if baseline:
        cases = [case for case in cases if case.baseline_workflow_id]
        if not cases:
            raise InvalidInput(f"no case of suite {suite.slug} names a single-agent baseline workflow")
    if not cases:
        raise InvalidInput(f"suite {suite.slug} has no case to run")
    with transaction.atomic():
        eval_run = EvalRun.objects.create(
            suite=suite, version=version, started_by=user, baseline=baseline, trigger=trigger or via
        )
        for case in cases:
            run_input = {**case.input, **({"model_version": version.slug} if version else {})}
            workflow = case.baseline_workflow if baseline else case.workflow
            run = run_start(
                workflow=workflow.slug, input=run_input, goal=case.goal, started_by=user, project=suite.project
            )
            EvalResult.objects.create(eval_run=eval_run, case=case, run=run)
        audit(
            actor=user,
            action="evaluate",
            target=f"evaluation suite {suite.slug} ({eval_run.label})",
            project_id=suite.project_id,
            via=via,
            detail={"eval_run": eval_run.id, "trigger": eval_run.trigger},
        )
    return eval_run


def eval_judge_run(run_id: int) -> None:
    """The run of an evaluation case ended or stopped for a human: judge it (again, if it stopped
    before and was resumed). Called by run_transition, in its transaction. Judge checks need a model:
    their result stays open and an outbox message grades it after commit (runs/evals/judge.py)."""
    if not sql.fetchone("SELECT EXISTS (SELECT 1 FROM runs_evalresult WHERE run_id = %s)", [run_id])[0]:
        return  # the common case, at the end of every run: one cheap statement
    results = list(EvalResult.objects.filter(run_id=run_id).select_related("case"))
    run = Run.objects.get(id=run_id)  # as the transition left it
    for result in results:
        failures = check_failures(result.case, run)
        graded = judges(result.case.checks)
        passed = None if graded else not failures
        EvalResult.objects.filter(id=result.id).update(passed=passed, failures=failures, grades=[], judge_cost_micros=0)
        if graded:
            outbox_add(actor=GRADE, kwargs={"result_id": result.id})


def verdicts(eval_run: EvalRun) -> dict[int, bool | None]:
    """Case id → passed (None: not settled yet)."""
    return dict(eval_run.results.values_list("case_id", "passed"))


def baseline_for(eval_run: EvalRun) -> EvalRun | None:
    """The pass the API sets a new one beside: the suite's previous one of the same kind."""
    earlier = EvalRun.objects.filter(suite_id=eval_run.suite_id, baseline=eval_run.baseline, id__lt=eval_run.id)
    return earlier.order_by("-id").first()


def accepted_baseline_for(eval_run: EvalRun) -> EvalRun | None:
    """The pass run_evals compares a new one with by default: the suite's last *accepted* pass of the same
    kind before it (run_evals exited 0 on it), so a red pass run again is compared with the last green
    one, not with itself."""
    earlier = EvalRun.objects.filter(
        suite_id=eval_run.suite_id, baseline=eval_run.baseline, id__lt=eval_run.id, accepted=True
    )
    return earlier.order_by("-id").first()


def _failing(eval_run: EvalRun, base: EvalRun | None) -> list[dict]:
    now, before = verdicts(eval_run), verdicts(base) if base else {}
    names = dict(eval_run.suite.cases.values_list("id", "name"))
    failures = dict(eval_run.results.values_list("case_id", "failures"))
    quarantined = set(eval_run.suite.quarantine.values_list("id", flat=True))
    return [
        {"case": case_id, "name": names.get(case_id, ""), "before": before.get(case_id),
         "failures": failures[case_id], "quarantined": case_id in quarantined}
        for case_id, passed in sorted(now.items())
        if passed is False
    ]  # fmt: skip


def regressions(eval_run: EvalRun, base: EvalRun | None) -> list[dict]:
    """The cases that fail in ``eval_run`` and passed in ``base`` (or are new to it, or there is no base)."""
    return [{k: v for k, v in item.items() if k != "quarantined"} for item in _failing(eval_run, base)
            if item["before"] is not False]  # fmt: skip


def failing(eval_run: EvalRun, base: EvalRun | None) -> list[dict]:
    """What makes run_evals exit 1: every case that fails now and is not in the suite's quarantine, whether
    or not it failed in ``base`` too (``before`` says how it did there)."""
    return [item for item in _failing(eval_run, base) if not item["quarantined"]]


def eval_run_accept(*, eval_run: EvalRun) -> None:
    """run_evals exited 0 on the pass: it becomes the baseline later passes are compared with."""
    EvalRun.objects.filter(id=eval_run.id).update(accepted=True)
    eval_run.accepted = True


def suites_for_change(kind: str, name: str) -> list[EvalSuite]:
    watched = f"{kind}:{name}"
    return [suite for suite in EvalSuite.objects.select_related("project") if watched in (suite.rerun_on or [])]


def eval_start_for_change(*, kind: str, name: str, version: str) -> list[EvalRun]:
    """A new version of an agent, a workflow or a policy was saved: start each suite that names it.
    Called after that commit; a suite that cannot start now (a case's workflow is gone) is logged."""
    started = []
    for suite in suites_for_change(kind, name):
        try:
            started.append(eval_start(suite=suite, via="version", trigger=f"new version: {kind} {name} {version}"))
        except InvalidInput as exc:
            log.warning("evaluation suite %s did not start for %s %s: %s", suite.slug, kind, name, exc)
    return started


def run_settled_heard(event: bus.RunSettled) -> None:
    """Subscribed durably (in run_transition's transaction, evals/apps.py): the verdict commits with the status."""
    eval_judge_run(event.run_id)


def _watching(kind: str) -> list[EvalSuite]:
    """The suites that rerun on a change of something of this kind: usually none (one statement)."""
    suites = EvalSuite.objects.select_related("project")
    return [suite for suite in suites if any(w.startswith(f"{kind}:") for w in suite.rerun_on or [])]


def version_created_heard(event: bus.VersionCreated) -> None:
    """After the commit of a new agent or workflow version (agents/versions.py): the suites naming it run."""
    if not _watching(event.kind):
        return
    model = AgentVersion if event.kind == "agent" else WorkflowVersion
    version = model.objects.select_related(event.kind).get(id=event.version_id)
    name = getattr(version, event.kind).slug
    eval_start_for_change(kind=event.kind, name=name, version=f"v{version.number}")


def policy_changed_heard(event: bus.PolicyChanged) -> None:
    """After the commit of a saved approval policy: a policy has no numbered versions, so each save is a
    new one, and the suites naming it run."""
    if not _watching("policy"):
        return
    name = ApprovalPolicy.objects.filter(id=event.policy_id).values_list("name", flat=True).first()
    if name is not None:
        eval_start_for_change(kind="policy", name=name, version="(saved)")


def eval_case_from_run(
    *, suite: EvalSuite, run: Run, name: str, checks: list | None = None, user=None, via: str = "page"
) -> EvalCase:
    """A new case of the suite that replays the run (its workflow, goal and input) and expects its outcome:
    by default the status it ended with and, for each artifact a reviewer scored 0.5 or more, that it
    matches what it said then. The run must be in the suite's project."""
    if run.project_id != suite.project_id:
        raise InvalidInput("the run is not in the suite's project", [{"field": "run", "message": "another project"}])
    checks = expected_checks(run) if checks is None else checks
    errors = checks_refusal(checks) + ([] if name.strip() else [{"field": "name", "message": "a case needs a name"}])
    if errors:
        raise InvalidInput("the case cannot be added: " + "; ".join(e["message"] for e in errors), errors)
    run_input = {key: value for key, value in (run.input or {}).items() if key not in ("model_version", "faults")}
    with transaction.atomic():
        case = EvalCase.objects.create(
            suite=suite,
            name=name.strip()[:200],
            workflow=Workflow.objects.get(id=run.workflow_id),
            goal=run.goal,
            input=run_input,
            checks=checks,
            from_run=run,
        )
        audit(
            actor=user,
            action="eval_case_add",
            target=f"evaluation suite {suite.slug}: {case.name}",
            project_id=suite.project_id,
            run_id=run.id,
            via=via,
        )
    return case


RERUN_KINDS = ("agent", "workflow", "policy")


def rerun_on_refusal(rerun_on) -> list[dict]:
    """Why a suite's ``rerun_on`` cannot be stored ("agent:<slug>", "workflow:<slug>", "policy:<name>")."""
    if not isinstance(rerun_on, list) or not all(isinstance(item, str) for item in rerun_on):
        return [{"field": "rerun_on", "message": "a list of strings"}]
    wrong = [item for item in rerun_on if item.partition(":")[0] not in RERUN_KINDS or not item.partition(":")[2]]
    return [{"field": "rerun_on", "message": f"{item!r} is not agent:<slug>, workflow:<slug> or policy:<name>"}
            for item in wrong]  # fmt: skip


def eval_suite_create(*, project, slug: str, name: str, description: str = "", rerun_on: list | None = None,
                      user=None, via: str = "api") -> EvalSuite:  # fmt: skip
    """A new, empty suite of the project (cases are added apart)."""
    errors = rerun_on_refusal(rerun_on or [])
    if EvalSuite.objects.filter(slug=slug).exists():
        errors.append({"field": "slug", "message": f"suite {slug} exists already"})
    if errors:
        raise InvalidInput("the suite cannot be created: " + "; ".join(e["message"] for e in errors), errors)
    with transaction.atomic():
        suite = EvalSuite.objects.create(project=project, slug=slug, name=name, description=description,
                                         rerun_on=rerun_on or [])  # fmt: skip
        audit(actor=user, action="eval_suite_create", target=f"evaluation suite {slug}", project_id=project.id, via=via)
    return suite


def eval_case_create(*, suite: EvalSuite, name: str, workflow: str, baseline_workflow: str = "", goal: str = "",
                     input: dict | None = None, checks: list, user=None, via: str = "api") -> EvalCase:  # fmt: skip
    """A new case of the suite: a workflow (by slug), its goal and input, and the checks its outcome must meet.
    ``user`` (None: a trusted caller) must see the workflows; one they may not see is refused as unknown."""
    found, errors = {}, checks_refusal(checks)
    for field, slug in (("workflow", workflow), ("baseline_workflow", baseline_workflow)):
        if slug:
            found[slug], refusal = _case_workflow(slug, field, suite=suite, user=user)
            errors += refusal
    if not workflow:
        errors.append({"field": "workflow", "message": "a case needs a workflow (or a run to replay)"})
    if not name.strip():
        errors.append({"field": "name", "message": "a case needs a name"})
    if errors:
        raise InvalidInput("the case cannot be added: " + "; ".join(e["message"] for e in errors), errors)
    with transaction.atomic():
        case = EvalCase.objects.create(suite=suite, name=name.strip()[:200], workflow=found[workflow], goal=goal,
                                       baseline_workflow=found.get(baseline_workflow), input=input or {},
                                       checks=checks)  # fmt: skip
        audit(actor=user, action="eval_case_add", target=f"evaluation suite {suite.slug}: {case.name}",
              project_id=suite.project_id, via=via)  # fmt: skip
    return case


def _case_workflow(slug: str, field: str, *, suite: EvalSuite, user) -> tuple[Workflow | None, list[dict]]:
    """A case's workflow, and why it cannot be one. Another project's workflow the user may not see answers
    as a missing one (nothing learned); one they see is refused too, as a case runs in the suite's project."""
    workflow = workflow_visible(slug=slug, user=user)
    if workflow is None:
        return None, [{"field": field, "message": f"no workflow {slug}"}]
    if workflow.project_id not in (None, suite.project_id):
        message = f"workflow {slug} belongs to another project: a case runs in the suite's project"
        return None, [{"field": field, "message": message}]
    return workflow, []


def expected_checks(run: Run) -> list[dict]:
    """What the run did, as checks a replay must meet: its status, and each well-scored artifact's content."""
    checks: list[dict] = [{"status": run.status}]
    good = Annotation.objects.filter(run=run, target=Annotation.Target.ARTIFACT, score__gte=0.5)
    for artifact in run.artifacts.filter(id__in=good.values("target_id")).select_related("task"):
        checks.append({"artifact": artifact.task.key, "equals": artifact.content, "path": ""})
    return checks


def annotation_create(
    *, run: Run, target: str, target_id: int | None, score: float | None, comment: str, user, via: str = "page"
) -> Annotation:
    """A reviewer's score or comment on the run or one of its tasks, spans or artifacts."""
    errors = []
    if target not in Annotation.Target.values:
        errors.append({"field": "target", "message": f"one of {', '.join(Annotation.Target.values)}"})
    elif target != "run" and not _target_exists(run, target, target_id):
        errors.append({"field": "target_id", "message": f"run {run.id} has no {target} {target_id}"})
    if score is not None and not 0 <= score <= 1:
        errors.append({"field": "score", "message": "a score is between 0 and 1"})
    if score is None and not comment.strip():
        errors.append({"field": "comment", "message": "a score or a comment"})
    if errors:
        raise InvalidInput("the annotation cannot be recorded: " + "; ".join(e["message"] for e in errors), errors)
    with transaction.atomic():
        note = Annotation.objects.create(
            run=run,
            target=target,
            target_id=None if target == "run" else target_id,
            score=score,
            comment=comment.strip()[:4000],
            author=user,
        )
        audit(actor=user, action="annotate", target=str(note), run_id=run.id, project_id=run.project_id, via=via)
    return note


def _target_exists(run: Run, target: str, target_id: int | None) -> bool:
    rows = {"task": run.tasks, "span": run.spans, "artifact": run.artifacts}[target]
    return target_id is not None and rows.filter(id=target_id).exists()

"""Questions agents ask people (the built-in tool human.ask): asked by the broker, answered by a person in
the inbox, on the question's card or through the API, expired or withdrawn by the sweeper and the engine.

The question's ledger row (a read, status executing while it waits) gets the answer as its receipt in
the answering transaction, which also wakes the parked task: the resumed attempt finds the receipt by key
and journals it as the call's result. Lock order as for decisions: the run, then the question, then its
operation and task.

Who may answer: whoever may decide in the run's project (reviewers and admins), never an agent's token.
Unlike an approval, the run's starter may answer: an answer changes nothing outside Warden; it is input
to the agent, like the goal the starter wrote, and every effect the agent then asks for is gated on its
own, with separation of duties there.
"""

import hashlib
import logging

from django.db import transaction
from django.db.models import F, OuterRef, Subquery
from django.utils import timezone

from core import bus
from core.errors import Conflict, Forbidden, InvalidInput, NotFound
from runs.models import Run, Task
from runs.selectors import run_workflow_settings
from tenancy.access import ACTIONS, role_of
from tenancy.audit import audit, audit_denied
from tools.human import ANSWER_LIMIT, ASK, answer_result
from tools.models import ToolOperation
from tools.transitions import OPERATION

from .models import Question
from .transitions import QUESTION
from .wake import parked_task_wake

log = logging.getLogger("warden.approvals")
QS, OS = Question.Status, ToolOperation.Status
BATCH = 200


def _policy(run_id: int) -> dict:
    """The workflow's trusted settings for human.ask: {"on_timeout": ..., "expires_after": seconds}."""
    policy = run_workflow_settings(run_id).tool_policies.get(ASK)  # the version the run started with
    return policy if isinstance(policy, dict) else {}


def question_for_operation(op: ToolOperation, *, arguments: dict) -> Question:
    """The question of a human.ask call, in its intent's transaction (core.hooks). Its deadline is the one
    the agent gave, else the workflow's ``expires_after``, else none; what its expiry does is the
    workflow's ``on_timeout`` as it is now (a later edit does not change a question already asked)."""
    bus.run_changed(op.run_id)
    policy = _policy(op.run_id)
    seconds = arguments.get("deadline_seconds") or policy.get("expires_after")
    on_timeout = policy.get("on_timeout")
    if on_timeout not in Question.OnTimeout.values:
        on_timeout = Question.OnTimeout.TELL_AGENT
    return Question.objects.create(
        run_id=op.run_id,
        task_id=op.task_id,
        step=op.step,
        operation=op,
        text=arguments["question"],
        choices=list(arguments.get("choices") or []),
        on_timeout=on_timeout,
        expires_at=timezone.now() + timezone.timedelta(seconds=int(seconds)) if seconds else None,
    )


def question_refusal(question: Question, *, user, project_id: int) -> Forbidden | None:
    """Why ``user`` may not answer ``question`` (None when they may): only people who may decide in the
    run's project answer questions. The one rule the service, the card and the API share; the question's
    own state (answered, expired) is the service's to refuse."""
    if user is None or not getattr(user, "is_authenticated", False):
        return Forbidden("only a signed-in person answers an agent's question")
    role = role_of(user, project_id)
    if role not in ACTIONS["decide"][0]:
        return Forbidden(
            f"your role in this project ({role or 'none'}) does not answer agents' questions (reviewers and admins do)"
        )
    return None


def _check(question: Question, run: Run, user, answer: str, now) -> str:
    """The answer as it will be recorded, or the refusal, changing nothing."""
    if question.status != QS.PENDING:
        raise Conflict(f"question {question.id} is {question.status}; it cannot be answered again")
    if question.expires_at and question.expires_at <= now:
        raise Conflict(f"question {question.id} has expired; it cannot be answered")
    refusal = question_refusal(question, user=user, project_id=run.project_id)
    if refusal is not None:
        raise refusal
    clean = (answer or "").strip()
    if not clean:
        raise InvalidInput("an answer cannot be empty", [{"field": "answer", "message": "required"}])
    if len(clean) > ANSWER_LIMIT:
        raise InvalidInput(
            f"an answer has at most {ANSWER_LIMIT} characters", [{"field": "answer", "message": "too long"}]
        )
    if question.choices and clean not in question.choices:
        message = "must be one of: " + ", ".join(question.choices)
        raise InvalidInput(
            f"question {question.id} asks for one of its choices", [{"field": "answer", "message": message}]
        )
    return clean


def question_answer(*, question_id: int, user, answer: str, request=None) -> Question:
    """A person's answer: recorded on the question and as its call's receipt, audited, and the parked task
    woken, in one transaction. A refusal (answered already, expired, not theirs to answer, empty, not one
    of the choices) changes nothing and is audited."""
    run_id = Question.objects.filter(id=question_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"question {question_id} does not exist")
    target, now = f"question {question_id}", timezone.now()
    try:
        with transaction.atomic():
            run = Run.objects.select_for_update().get(id=run_id)
            question = Question.objects.select_for_update().get(id=question_id)
            clean = _check(question, run, user, answer, now)
            bus.run_changed(run.id)
            QUESTION.move(question, QS.ANSWERED, answer=clean, answered_by=user, answered_at=now)
            receipt = answer_result(clean)
            _settle_operation(question, OS.COMMITTED, f"answered by {user}", now, result=receipt, committed_at=now)
            audit(
                actor=user,
                action="answer",
                run=run,
                target=target,
                request=request,
                # The answer itself stays on the question (it may be sensitive); its digest is enough here.
                detail={"answer_sha256": hashlib.sha256(clean.encode()).hexdigest(), "choice": bool(question.choices)},
            )
            parked_task_wake(run, question.task_id, f"question {question.id} answered by {user}", now)
    except (Conflict, Forbidden, InvalidInput) as refusal:  # recorded outside the rolled-back transaction
        audit_denied(actor=user, action="answer", run=Run.objects.get(id=run_id), target=target, request=request,
                     refusal=refusal)  # fmt: skip
        raise
    log.info("question %s of run %s answered", question_id, run_id)
    question.refresh_from_db()
    return question


def _settle_operation(question: Question, to: str, reason: str, now, **fields) -> None:
    """The question's ledger row gets its outcome (still waiting: executing). Run and question locked."""
    op = ToolOperation.objects.select_for_update().filter(id=question.operation_id).first()
    if op is not None and op.status == OS.EXECUTING:
        OPERATION.move(op, to, status_reason=reason[:1000], ended_at=now, **fields)


def questions_withdraw(*, run: Run, reason: str, now) -> int:
    """The run moved on (cancelled, compensated): nobody needs to answer. Run locked."""
    withdrawn = 0
    for question in Question.objects.select_for_update().filter(run=run, status=QS.PENDING):
        QUESTION.move(question, QS.WITHDRAWN)
        _settle_operation(question, OS.REJECTED, f"not answered: {reason}", now)
        withdrawn += 1
    return withdrawn


def questions_expire(now) -> int:
    expired = 0
    due = Question.objects.filter(status=QS.PENDING, expires_at__lte=now).values_list("id", flat=True)[:BATCH]
    for question_id in list(due):
        expired += _expire(question_id, now)
    return expired


def _expire(question_id: int, now) -> int:
    """What the run's policy says an unanswered question does: the agent is told nobody answered and goes
    on (tell_agent, the default), or its task fails and the run needs attention (fail_task). Either way the
    parked task is woken and its attempt reads the outcome from the ledger, as after an answer."""
    run_id = Question.objects.values_list("run_id", flat=True).get(id=question_id)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run_id)
        question = Question.objects.select_for_update().get(id=question_id)
        if question.status != QS.PENDING or not question.expires_at or question.expires_at > now:
            return 0
        bus.run_changed(run.id)
        QUESTION.move(question, QS.EXPIRED)
        if question.on_timeout == Question.OnTimeout.FAIL_TASK:
            reason = "nobody answered the question before it expired, and the workflow says that fails the task"
            _settle_operation(question, OS.FAILED, reason, now)
        else:
            reason = "nobody answered the question before it expired: go on without the answer"
            _settle_operation(question, OS.REJECTED, reason, now)
        parked_task_wake(run, question.task_id, f"question {question.id} expired", now)
    log.info("question %s of run %s expired (%s)", question_id, run_id, question.on_timeout)
    return 1


def _stranded():
    """Questions no longer pending whose task is still parked on them: its latest call is the question's."""
    latest = ToolOperation.objects.filter(task=OuterRef("task")).order_by("-id").values("id")[:1]
    return (
        Question.objects.exclude(status=QS.PENDING)
        .filter(task__status=Task.Status.WAITING_FOR_APPROVAL, operation__isnull=False)
        .exclude(operation__status=OS.EXECUTING)
        .annotate(latest=Subquery(latest))
        .filter(operation_id=F("latest"))
    )


def parked_tasks_wake(now) -> int:
    """Tasks still parked on a question that was answered or expired: woken. The answering (or expiring)
    transaction wakes its task itself; this covers whatever left one parked (a crash, a lost wake-up)."""
    woken = 0
    stranded = _stranded().filter(run__status__in=[Run.Status.RUNNING, Run.Status.WAITING_FOR_APPROVAL])
    for question_id, task_id, run_id in list(stranded.values_list("id", "task_id", "run_id")[:BATCH]):
        with transaction.atomic():
            run = Run.objects.select_for_update().get(id=run_id)
            if not _stranded().filter(id=question_id).exists():
                continue  # woken, or parked on something else, since
            if parked_task_wake(run, task_id, f"question {question_id} settled: woken by the sweeper", now):
                woken += 1
    return woken


def questions_sweep(now) -> dict:
    """The questions' pass of the recovery sweeper (registered in approvals/apps.py)."""
    return {"questions_expired": questions_expire(now), "parked_tasks_woken": parked_tasks_wake(now)}

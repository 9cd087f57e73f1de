"""Agents' questions to people (human.ask): the card the inbox shows for each, and its answer, posted in
place like a reviewer's decision (dashboard/views/queue.py)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_POST

from approvals.models import Question
from approvals.questions import question_answer, question_refusal
from core.errors import Forbidden, InvalidInput, NotFound, WardenError
from tenancy.access import authorize, project_ids


def question_card(question: Question, user) -> dict:
    """The context of templates/approvals/_question.html: the question, and whether ``user`` may answer it
    or the reason why not (shown instead of the form, before any click)."""
    refusal = question_refusal(question, user=user, project_id=question.run.project_id)
    return {
        "question": question,
        "may_answer": question.status == Question.Status.PENDING and not refusal,
        "refusal": refusal,
    }


def pending_questions(user):
    """The pending questions of the projects ``user`` may view, oldest first, ready for question_card."""
    rows = Question.objects.filter(status=Question.Status.PENDING)
    visible = project_ids(user, "view")
    if visible is not None:
        rows = rows.filter(run__project_id__in=visible)
    return rows.select_related("run__project", "run__workflow", "task", "answered_by").order_by("created_at", "id")


def _question(question_id: int) -> Question | None:
    return (
        Question.objects.select_related("run__project", "run__workflow", "task", "answered_by")
        .filter(id=question_id)
        .first()
    )


def _status(exc: WardenError) -> int:
    if isinstance(exc, Forbidden):
        return 403
    if isinstance(exc, InvalidInput):
        return 400
    return 409  # answered already, expired, withdrawn


@login_required
@require_POST
def answer(request, question_id: int):
    """Answer, then the card as it now stands. A refusal is said on the card; htmx swaps only a 2xx, so an
    htmx request gets 200 with the reason, a plain form post its status (403, 409, 400)."""
    question = _question(question_id)
    error, status = "", 200
    try:
        if question is None:
            raise NotFound("this question does not exist")
        what = f"question {question_id}"
        authorize(request.user, question.run.project_id, "decide", what=what, request=request)
        question_answer(
            question_id=question_id, user=request.user, answer=request.POST.get("answer", ""), request=request
        )
    except NotFound as exc:
        # Someone outside the question's project learns nothing of it, not even that it exists.
        return render(request, "approvals/_gone.html", {"error": str(exc)}, status=404)
    except WardenError as exc:
        error = str(exc) + "".join(f" — {d['field']}: {d['message']}" for d in getattr(exc, "errors", []) or [])
        status = 200 if request.htmx else _status(exc)
    context = {**question_card(_question(question_id), request.user), "error": error}
    response = render(request, "approvals/_question.html", context, status=status)
    if not error:
        response["HX-Trigger"] = "question-answered"
    return response

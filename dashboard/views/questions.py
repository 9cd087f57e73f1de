"""Agents' questions to people (human.ask): the card the inbox shows for each, and its answer, posted in
place like a reviewer's decision (dashboard/views/queue.py)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_POST

from approvals.questions import question_answer
from approvals.selectors.questions import question_card, question_get
from core.errors import Forbidden, InvalidInput, NotFound, WardenError
from tenancy.access import authorize


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
    question = question_get(question_id)
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
    context = {**question_card(question_get(question_id), request.user), "error": error}
    response = render(request, "approvals/_question.html", context, status=status)
    if not error:
        response["HX-Trigger"] = "question-answered"
    return response

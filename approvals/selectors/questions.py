"""Agents' questions to people, as the inbox (page and API) lists them."""

from approvals.models import Question
from approvals.questions import question_refusal
from tenancy.access import project_ids


def question_card(question: Question, user) -> dict:
    """The context of templates/approvals/_question.html: the question, and whether ``user`` may answer it
    or the reason why not (shown instead of the form, before any click)."""
    refused = question_refusal(question, user=user, project_id=question.run.project_id)
    return {
        "question": question,
        "may_answer": question.status == Question.Status.PENDING and refused is None,
        "refusal": str(refused) if refused is not None else "",
    }


def pending_questions(user):
    """The pending questions of the projects ``user`` may view, oldest first, ready for question_card."""
    rows = Question.objects.filter(status=Question.Status.PENDING)
    visible = project_ids(user, "view")
    if visible is not None:
        rows = rows.filter(run__project_id__in=visible)
    return rows.select_related("run__project", "run__workflow", "task", "answered_by").order_by("created_at", "id")


def question_get(question_id: int) -> Question | None:
    """One question with its run, project, workflow, task and who answered it. One query."""
    return (
        Question.objects.select_related("run__project", "run__workflow", "task", "answered_by")
        .filter(id=question_id)
        .first()
    )

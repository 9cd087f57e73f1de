"""The selectors above the engine (approvals/selectors/, tenancy.selectors, agents.selectors): what each
reads for the pages and the API, and how many queries it costs. The counts are in each case's id and hold
in both modes."""

import pytest

from agents.selectors import agents_listed
from approvals.models import Question
from approvals.selectors import queue
from approvals.selectors.inbox import inbox_counts, inbox_items
from approvals.selectors.questions import pending_questions, question_card, question_get
from policy.models import ApprovalRequest
from runs.models import Run
from runs.selectors.insight import insight_choices, insight_compute
from tenancy.access import default_project, membership_grant, project_ids
from tenancy.audit import audit
from tenancy.selectors import audit_events, project_by_slug, project_slugs, projects_visible
from tests.runs.test_insight import approval, failing_op, make_run


@pytest.fixture
def scene(demo, operator, django_user_model):
    """Two runs of the default project: one waits for a reviewer (an operation request, decided by nobody
    yet, with its ledger row) and asks a question; the other needs attention. ``reviewer`` may decide."""
    reviewer = django_user_model.objects.create_user(username="rita", password="reviewer-pass-123")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    waiting = make_run("deploy-review", status=Run.Status.WAITING_FOR_APPROVAL)
    request = approval(waiting, ApprovalRequest.Status.PENDING)
    op = failing_op(waiting, "email.send", status="awaiting_approval")
    op.approval = request
    op.save(update_fields=["approval"])
    task = waiting.tasks.order_by("id").first()
    Question.objects.create(run=waiting, task=task, step=1, text="which customer?")
    make_run("incident-fanout", status=Run.Status.NEEDS_ATTENTION)
    audit(actor=operator, action="run_cancel", target="run 1", project_id=default_project().id)
    return {"operator": operator, "reviewer": reviewer, "request": request, "op": op}


def _insight(s):
    visible = project_ids(s["operator"], "view")
    projects, workflows = insight_choices(visible=visible)
    return insight_compute(visible=visible, projects=projects, workflows=workflows)


CASES = [
    # the reviewer queue
    ("approvals_pending-1", 1, lambda s: list(queue.approvals_pending(visible=[s["request"].run.project_id]))),
    ("approval_get-1", 1, lambda s: queue.approval_get(s["request"].id)),
    ("approval_operations_of_one_call-1", 1, lambda s: queue.approval_operations(s["request"])),
    ("approval_asked_outside_a_step-0", 0, lambda s: queue.approval_asked(s["op"])),
    ("approvals_pending_counted-1", 1, lambda s: list(queue.approvals_pending_counted())),
    ("question_get-1", 1, lambda s: question_get(0)),
    ("change_request_project-1", 1, lambda s: queue.change_request_project(0)),
    # the inbox: the person's roles once per kind, then each kind's rows (questions: their refusal too)
    ("pending_questions-2", 2, lambda s: list(pending_questions(s["reviewer"]))),  # their projects, the rows
    ("insight_choices-2", 2, lambda s: [list(rows) for rows in insight_choices(visible=None)]),
    # insight: the viewer's projects, the two choices; the runs grouped, their percentiles, operations,
    # tasks, approval requests, usage
    ("insight_compute_with_its_choices-9", 9, _insight),
    # tenancy and agents
    ("audit_events-1", 1, lambda s: list(audit_events(visible=None, action="run_cancel"))),
    ("project_slugs-1", 1, lambda s: project_slugs([1])),
    ("project_by_slug-1", 1, lambda s: project_by_slug("default")),
    ("projects_visible-1", 1, lambda s: projects_visible(visible=None)),
    ("agents_listed-1", 1, lambda s: list(agents_listed())),
]


@pytest.mark.parametrize(("count", "call"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_selector_takes_its_fixed_number_of_queries(scene, count, call, django_assert_num_queries):
    with django_assert_num_queries(count):
        call(scene)


def test_the_inbox_of_a_reviewer_takes_eleven_queries(scene, django_assert_num_queries):
    """The seven kinds: the person's projects for each kind's action and its rows (none for the kinds
    their role does not act on); a question also asks its refusal, an approval its decider rule."""
    with django_assert_num_queries(11):
        items = inbox_items(scene["reviewer"])
    assert {i.kind for i in items} == {"approval", "question"}
    with django_assert_num_queries(11):
        assert inbox_counts(scene["reviewer"])["approval"] == 1


def test_a_question_card_says_whether_the_person_may_answer(scene, django_assert_num_queries):
    (question,) = pending_questions(scene["reviewer"])
    with django_assert_num_queries(1):  # the person's role in the run's project
        card = question_card(question, scene["reviewer"])
    assert card["may_answer"] and card["refusal"] == ""


def test_the_queue_reads_a_visible_request_and_hides_another_projects(scene):
    project = scene["request"].run.project_id
    assert list(queue.approvals_pending(visible=[project])) == [scene["request"]]
    assert list(queue.approvals_pending(visible=[])) == []
    assert queue.approval_operations(scene["request"]) == [scene["op"]]

"""Ask a human (human.ask): the task parks without a worker, a person answers through the API or the page,
the answer is the call's receipt and the task resumes with it; refusals change nothing; expiry follows
the workflow's on_timeout; a lost wake-up is recovered by the sweeper."""

import pytest
from django.utils import timezone

from approvals.models import Question
from approvals.questions import questions_sweep
from policy.models import ApprovalRequest
from runs.models import Artifact, Run, Span, Task
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tenancy.tokens import api_token_create
from tests.conftest import wait_for
from tests.runs.test_engine import finished, scripted_workflow
from tools.models import ToolOperation

ASK = {"question": "Ship <b>tonight</b>?", "choices": ["yes", "no"]}


@pytest.fixture
def people(django_user_model):
    home, other = default_project(), Project.objects.create(slug="elsewhere", name="Elsewhere")
    found = {}
    for name, project, role in [
        ("rita", home, "reviewer"),
        ("vic", home, "viewer"),
        ("olga", home, "operator"),
        ("otto", other, "admin"),
    ]:
        user = django_user_model.objects.create_user(username=name, password=f"{name}-pass-123")
        membership_grant(user=user, project=project, role=role)
        found[name] = user
    return found


def token(user) -> str:
    return api_token_create(user=user, scopes=["read", "approve"])[1]


def api(client, user, method: str, path: str, body=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token(user)}"}
    if method == "post":
        return client.post(f"/api/v1{path}", data=body or {}, content_type="application/json", **headers)
    return client.get(f"/api/v1{path}", **headers)


def asked(run) -> Question:
    """The run's question, once its task has parked on it."""

    def parked():
        q = Question.objects.filter(run=run).first()
        return q if q and Task.objects.get(id=q.task_id).status == Task.Status.WAITING_FOR_APPROVAL else None

    return wait_for(parked, message="the task to park on its question")


def asking_workflow(slug="asking", final="{last[answer]}", **policy):
    script = [
        {"say": "I need a person.", "tool": "human.ask", "arguments": ASK},
        {"final": {"summary": final}},
    ]
    wf = scripted_workflow(slug, script, tools=["human.ask"])
    if policy:
        wf.tool_policies = {"human.ask": policy}
        wf.save(update_fields=["tool_policies"])
    return wf


def unchanged(question: Question) -> tuple:
    question.refresh_from_db()
    op = ToolOperation.objects.get(id=question.operation_id)
    return question.status, question.answer, op.status, op.result


def test_the_task_parks_without_a_worker_and_an_answer_through_the_api_resumes_it(demo_tx, worker, client, people):
    run = run_start(workflow="ask-a-human")
    question = asked(run)
    task = Task.objects.get(id=question.task_id)
    assert task.lease_owner == "" and task.lease_expires_at is None  # no worker holds it while it waits
    assert Run.objects.get(id=run.id).status == Run.Status.WAITING_FOR_APPROVAL
    op = ToolOperation.objects.get(id=question.operation_id)
    assert (op.tool, op.status, op.step, op.tool_class) == ("human.ask", "executing", question.step, "read_only")
    assert question.choices == ["tonight", "tomorrow morning", "next week"] and question.expires_at is not None

    listed = api(client, people["rita"], "get", "/questions?status=pending").json()
    assert [q["id"] for q in listed] == [question.id] and listed[0]["text"] == question.text
    answered = api(client, people["rita"], "post", f"/questions/{question.id}/answer", {"answer": "tonight"})
    assert answered.status_code == 200, answered.json()
    assert answered.json()["status"] == "answered" and answered.json()["answered_by"] == "rita"

    assert finished(run).status == Run.Status.COMPLETED, run.status_reason
    assert Artifact.objects.get(run=run).content == {"summary": "Release window chosen by a person: tonight"}
    (span,) = Span.objects.filter(task_id=task.id, kind=Span.Kind.TOOL_CALL, name="human.ask", step__isnull=False)
    assert span.body["result"] == {"answer": "tonight"}  # journaled as the tool call's result
    assert ToolOperation.objects.filter(tool="human.ask").count() == 1  # resumed, never asked twice
    assert AuditEvent.objects.filter(actor=people["rita"], action="answer", outcome="done", run=run).exists()

    again = api(client, people["rita"], "post", f"/questions/{question.id}/answer", {"answer": "next week"})
    assert again.status_code == 409 and "cannot be answered again" in again.json()["message"]
    assert Question.objects.get(id=question.id).answer == "tonight"


def test_an_answer_on_the_page_resumes_the_task_and_returns_the_card(demo_tx, worker, client, people):
    run = run_start(workflow=asking_workflow(final="free text: {last[answer]}").slug)
    question = asked(run)
    client.force_login(people["rita"])
    card = client.post(f"/questions/{question.id}/answer", {"answer": "yes"}, HTTP_HX_REQUEST="true")
    html = card.content.decode()
    assert card.status_code == 200 and f'id="question-{question.id}"' in html and "Answered by rita" in html
    assert "Ship &lt;b&gt;tonight&lt;/b&gt;?" in html and "<b>tonight</b>" not in html  # escaped
    assert card["HX-Trigger"] == "question-answered"
    assert finished(run).status == Run.Status.COMPLETED, run.status_reason
    assert Artifact.objects.get(run=run).content == {"summary": "free text: yes"}


def test_an_answer_outside_the_choices_or_empty_is_refused_and_changes_nothing(demo_tx, worker, client, people):
    run = run_start(workflow=asking_workflow().slug)
    question = asked(run)
    before = unchanged(question)
    for body in ({"answer": "maybe"}, {"answer": "   "}, {"answer": ""}, {"answer": 3}, {}):
        response = api(client, people["rita"], "post", f"/questions/{question.id}/answer", body)
        assert response.status_code == 422, (body, response.json())
        assert unchanged(question) == before
    assert "must be one of: yes, no" in str(
        api(client, people["rita"], "post", f"/questions/{question.id}/answer", {"answer": "maybe"}).json()
    )
    assert AuditEvent.objects.filter(actor=people["rita"], action="answer", outcome="denied").exists()
    client.force_login(people["rita"])
    page = client.post(f"/questions/{question.id}/answer", {"answer": "maybe"})
    assert page.status_code == 400 and "must be one of" in page.content.decode()
    assert unchanged(question) == before
    assert Task.objects.get(id=question.task_id).status == Task.Status.WAITING_FOR_APPROVAL


def test_an_outsider_gets_404_a_viewer_or_operator_403_and_nothing_changes(demo_tx, worker, client, people):
    run = run_start(workflow=asking_workflow().slug)
    question = asked(run)
    before = unchanged(question)
    path = f"/questions/{question.id}"
    assert api(client, people["otto"], "get", path).status_code == 404
    assert api(client, people["otto"], "get", "/questions").json() == []  # not even listed
    assert api(client, people["otto"], "post", f"{path}/answer", {"answer": "yes"}).status_code == 404
    assert api(client, people["vic"], "get", path).status_code == 200  # a viewer sees it
    for who in ("vic", "olga"):
        refused = api(client, people[who], "post", f"{path}/answer", {"answer": "yes"})
        assert refused.status_code == 403, refused.json()
    reader = api_token_create(user=people["rita"], scopes=["read"])[1]  # a reviewer's token without approve
    response = client.post(
        f"/api/v1{path}/answer", data={"answer": "yes"}, content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {reader}",
    )  # fmt: skip
    assert response.status_code == 403 and "approve" in response.json()["message"]
    client.force_login(people["otto"])
    gone = client.post(f"{path}/answer", {"answer": "yes"})
    assert gone.status_code == 404 and question.text not in gone.content.decode()
    client.force_login(people["vic"])
    page = client.post(f"{path}/answer", {"answer": "yes"})
    assert page.status_code == 403 and "your role in this project (viewer)" in page.content.decode()
    assert unchanged(question) == before


def test_the_card_shows_a_reason_instead_of_the_form_to_someone_who_may_not_answer(demo_tx, worker, people):
    from approvals.selectors.questions import question_card

    run = run_start(workflow=asking_workflow().slug)
    question = Question.objects.select_related("run__project", "run__workflow", "task").get(id=asked(run).id)
    assert question_card(question, people["rita"]) == {"question": question, "may_answer": True, "refusal": ""}
    card = question_card(question, people["vic"])
    assert not card["may_answer"] and "viewer" in card["refusal"]


def test_an_unanswered_question_tells_the_agent_by_default(demo_tx, worker):
    run = run_start(workflow=asking_workflow(final="{last[error][code]}: {last[error][message]}").slug)
    question = asked(run)
    assert question.expires_at is None and question.on_timeout == "tell_agent"  # no deadline: it waits
    Question.objects.filter(id=question.id).update(expires_at=timezone.now())
    assert questions_sweep(timezone.now())["questions_expired"] == 1
    assert finished(run).status == Run.Status.COMPLETED, run.status_reason
    summary = Artifact.objects.get(run=run).content["summary"]
    assert summary.startswith("unanswered: nobody answered the question before it expired"), summary
    assert Question.objects.get(id=question.id).status == "expired"


def test_an_unanswered_question_fails_the_task_when_the_workflow_says_so(demo_tx, worker, client, people):
    wf = asking_workflow(on_timeout="fail_task", expires_after=3600)
    run = run_start(workflow=wf.slug)
    question = asked(run)
    assert question.on_timeout == "fail_task" and question.expires_at > timezone.now()
    assert questions_sweep(timezone.now())["questions_expired"] == 0  # not due yet
    assert questions_sweep(question.expires_at)["questions_expired"] == 1
    assert finished(run).status == Run.Status.NEEDS_ATTENTION
    task = Task.objects.get(id=question.task_id)
    assert task.status == Task.Status.FAILED and task.failure_class == "policy", task.status_reason
    late = api(client, people["rita"], "post", f"/questions/{question.id}/answer", {"answer": "yes"})
    assert late.status_code == 409 and Question.objects.get(id=question.id).status == "expired"


def test_a_task_left_parked_after_its_answer_is_woken_by_the_sweeper(demo_tx, worker, client, people, monkeypatch):
    """A crash between the answer and the wake (here: the wake never happens) leaves the task parked with
    its answer recorded; the sweeper's pass sends it on, and it resumes with that answer."""
    run = run_start(workflow=asking_workflow().slug)
    question = asked(run)
    monkeypatch.setattr("approvals.questions.parked_task_wake", lambda *args: False)
    assert api(client, people["rita"], "post", f"/questions/{question.id}/answer", {"answer": "no"}).status_code == 200
    assert Task.objects.get(id=question.task_id).status == Task.Status.WAITING_FOR_APPROVAL
    monkeypatch.undo()
    # This pass, or the worker's own sweeper if it comes first: without one the task would stay parked.
    questions_sweep(timezone.now())
    assert finished(run).status == Run.Status.COMPLETED, run.status_reason
    assert Artifact.objects.get(run=run).content == {"summary": "no"}
    assert questions_sweep(timezone.now())["parked_tasks_woken"] == 0


def test_cancelling_the_run_withdraws_its_question(demo_tx, worker, people):
    from runs.services import run_cancel

    run = run_start(workflow=asking_workflow().slug)
    question = asked(run)
    run_cancel(run_id=run.id, reason="not needed")
    assert finished(run).status == Run.Status.CANCELLED
    question.refresh_from_db()
    assert question.status == "withdrawn"
    assert ToolOperation.objects.get(id=question.operation_id).status == "rejected"


def test_the_listing_costs_the_same_queries_for_one_question_or_many(demo, client, people):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from approvals.selectors.questions import pending_questions

    run = run_start(workflow="deploy-review")
    reviewer = token(people["rita"])

    def listing() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            found = client.get("/api/v1/questions", HTTP_AUTHORIZATION=f"Bearer {reviewer}").json()
        return len(found), len(queries)

    assert listing()[0] == 0  # the first use of a token also stamps its last use
    for n, task in enumerate(run.tasks.order_by("id"), 1):
        Question.objects.create(run=run, task=task, step=n, text=f"question {n}")
        if n == 1:
            one = listing()
    many = listing()
    assert one[0] == 1 and many[0] == 3 and one[1] == many[1]
    assert [q.text for q in pending_questions(people["rita"])] == ["question 1", "question 2", "question 3"]
    assert list(pending_questions(people["otto"])) == []


def test_the_sweeper_leaves_alone_a_task_that_parked_on_an_approval_after_its_answer(demo_tx, worker, client, people):
    script = [
        {"tool": "human.ask", "arguments": ASK},
        {"tool": "email.send", "arguments": {"to": "a@x.example", "subject": "{last[answer]}", "body": "b"}},
        {"final": {"summary": "sent"}},
    ]
    wf = scripted_workflow("ask-then-mail", script, tools=["human.ask", "email.send"])
    wf.tool_policies = {"email.send": {"approval": "always"}}
    wf.save(update_fields=["tool_policies"])
    run = run_start(workflow=wf.slug)
    question = asked(run)
    assert api(client, people["rita"], "post", f"/questions/{question.id}/answer", {"answer": "yes"}).status_code == 200
    wait_for(lambda: ApprovalRequest.objects.filter(run=run, status="pending").exists(), message="the approval")
    wait_for(lambda: Task.objects.get(id=question.task_id).status == Task.Status.WAITING_FOR_APPROVAL)
    assert questions_sweep(timezone.now())["parked_tasks_woken"] == 0
    assert Task.objects.get(id=question.task_id).status == Task.Status.WAITING_FOR_APPROVAL
    assert ToolOperation.objects.get(tool="email.send").arguments["subject"] == "yes"  # the answer reached it


def test_a_wake_up_message_lost_after_the_answer_committed_is_sent_by_the_sweeper(
    demo_tx, worker, client, people, monkeypatch
):
    """The process dies after the answer's commit, before its message leaves (here: the send is dropped):
    the outbox row it left is sent by the recovery sweeper, and the task resumes with the answer."""
    from runs.models import Outbox
    from runs.services.recovery import resend_outbox

    run = run_start(workflow=asking_workflow().slug)
    question = asked(run)
    monkeypatch.setattr("runs.services.outbox.outbox_deliver", lambda *, rows: 0)
    assert api(client, people["rita"], "post", f"/questions/{question.id}/answer", {"answer": "yes"}).status_code == 200
    assert Task.objects.get(id=question.task_id).status == Task.Status.READY and Outbox.objects.exists()
    monkeypatch.undo()
    assert resend_outbox(timezone.now() + timezone.timedelta(minutes=5)) >= 1
    assert finished(run).status == Run.Status.COMPLETED, run.status_reason
    assert Artifact.objects.get(run=run).content == {"summary": "yes"}

"""The judge check: a model grades an artifact of the case's run against a rubric, through the model
gateway (any provider an agent can use: the judge *is* an agent, whose provider, model, instructions
and script say how it answers; the scripted provider in tests and demos).

A model call is I/O: it never happens inside the transaction that ended the run. That transaction
records the other checks and leaves ``passed`` empty; after commit an actor grades (``eval_grade``) and
records score, reasoning and cost in a second short transaction. The judge's answer is model output:
a score outside 0..1 or an answer that is not one fails the check, and its reasoning is data.
"""

import json

from django.db import transaction

from agents.gateway import ModelRequest, model_complete
from agents.models import Agent
from core.errors import StepFailure

from .checks import finished, judges
from .models import EvalResult

JUDGE_INSTRUCTIONS = (
    "You grade the output of an AI agent against a rubric. Answer with JSON only: "
    '{"score": <a number from 0 (fails the rubric) to 1 (meets it fully)>, "reasoning": "<why, briefly>"}.'
)
MAX_ARTIFACT_CHARS = 20_000  # what the judge is shown of a long artifact


def _prompt(judge: dict, content) -> str:
    shown = json.dumps(content, indent=1, default=str)[:MAX_ARTIFACT_CHARS]
    return f"Rubric:\n{judge['rubric']}\n\nThe output to grade ({judge['artifact']}):\n{shown}"


def _answer(response) -> tuple[float | None, str]:
    answer = response.final
    if isinstance(answer, str):
        try:
            answer = json.loads(answer)
        except json.JSONDecodeError:
            return None, f"the judge did not answer with JSON: {answer[:200]}"
    score = answer.get("score") if isinstance(answer, dict) else None
    reasoning = str(answer.get("reasoning", ""))[:2000] if isinstance(answer, dict) else ""
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        return None, f"the judge's score is not a number from 0 to 1: {str(score)[:50]}; {reasoning}"
    return float(score), reasoning


def grade(judge: dict, *, run, project_id: int) -> dict:
    """One judge check on the run's latest artifact of ``judge['artifact']``: its grade, as recorded."""
    grade = {"artifact": judge["artifact"], "agent": judge["agent"], "score": None, "cost_micros": 0, "model": ""}
    minimum = float(judge.get("min_score", 0.5))
    agent = Agent.objects.filter(slug=judge["agent"]).first()
    artifact = run.artifacts.filter(task__key=judge["artifact"]).order_by("-version").first()
    if agent is None or artifact is None:
        missing = f"no judge agent {judge['agent']}" if agent is None else f"no artifact from {judge['artifact']}"
        return {**grade, "reasoning": missing, "passed": False}
    request = ModelRequest(
        agent_slug=agent.slug,
        instructions=agent.instructions or JUDGE_INSTRUCTIONS,
        prompt=_prompt(judge, artifact.content),
        turn=1,
        attempt=1,
        context={"task": "judge", "artifact": artifact.content},
        project_id=project_id,
        endpoint=agent.endpoint,
    )
    try:
        response = model_complete(provider=agent.provider, script=agent.script, model=agent.model, request=request)
    except StepFailure as exc:  # transient ones included: the case is graded once, as failed, and says why
        return {**grade, "reasoning": f"the judge could not answer: {exc}", "passed": False}
    score, reasoning = _answer(response)
    passed = score is not None and score >= minimum
    return {
        **grade,
        "score": score,
        "reasoning": reasoning,
        "passed": passed,
        "cost_micros": response.cost_micros,
        "model": f"{response.provider or agent.provider}/{response.model}",
    }


def eval_grade(result_id: int) -> bool:
    """Grade a finished case's judge checks and settle its verdict (an actor calls this after commit).
    Safe to run twice: a result already settled is left alone. False when there was nothing to grade."""
    result = EvalResult.objects.select_related("case", "run", "eval_run__suite").filter(id=result_id).first()
    if result is None or result.passed is not None or not finished(result.run):
        return False
    checks = judges(result.case.checks)
    grades = [grade(judge, run=result.run, project_id=result.eval_run.suite.project_id) for judge in checks]
    failures = []
    for each, judge in zip(grades, checks, strict=True):
        if not each["passed"]:
            score = "no score" if each["score"] is None else f"score {each['score']:.2f}"
            failures.append(f"judge on {each['artifact']}: {score}, under {judge.get('min_score', 0.5)}")
    with transaction.atomic():
        settled = EvalResult.objects.filter(id=result.id, passed__isnull=True).update(
            grades=grades,
            judge_cost_micros=sum(each["cost_micros"] for each in grades),
            failures=result.failures + failures,
            passed=not result.failures and not failures,
        )
    return bool(settled)

"""Each prompt is built from the task's own objective, schema, inputs and recent steps."""

from agents.prompts import build_prompt


def journal(n):
    return [
        {"step": i, "kind": "model_call", "name": "m", "body": {"text": f"thought {i} " + "x" * 50}}
        for i in range(1, n + 1)
    ]


def test_prompt_size_stays_bounded_however_long_the_task_runs():
    short = build_prompt(objective="o", output_schema={}, dependencies={}, journal=journal(10))
    long = build_prompt(objective="o", output_schema={}, dependencies={}, journal=journal(1000))
    assert abs(len(long) - len(short)) < 100
    assert "(992 earlier steps omitted)" in long and "thought 1000" in long and "thought 5 " not in long


def test_prompt_carries_objective_schema_and_dependency_artifacts_only():
    prompt = build_prompt(
        objective="Give the verdict",
        output_schema={"type": "object"},
        dependencies={"risk": {"summary": "low"}},
        journal=[],
    )
    assert "Objective: Give the verdict" in prompt and '"type": "object"' in prompt
    assert 'Input from risk: {"summary": "low"}' in prompt


def test_the_context_budget_drops_the_oldest_step_records_first_and_keeps_the_newest():
    big = [
        {"step": i, "kind": "tool_call", "name": "crm.read", "body": {"result": f"record {i} " + "y" * 400}}
        for i in range(1, 7)
    ]
    roomy = build_prompt(objective="o", output_schema={}, dependencies={}, journal=big, budget_chars=100_000)
    tight = build_prompt(objective="o", output_schema={}, dependencies={}, journal=big, budget_chars=1000)
    assert all(f"record {i} " in roomy for i in range(1, 7)) and "omitted" not in roomy
    assert len(tight) <= 1000 + 100  # the budget, and the line that says what was left out
    assert "record 6 " in tight and "record 5 " in tight and "record 1 " not in tight
    assert "(4 earlier steps omitted)" in tight
    # However small the budget, the model still sees its latest step.
    assert "record 6 " in build_prompt(objective="o", output_schema={}, dependencies={}, journal=big, budget_chars=10)

"""Reference evaluations: a suite of cases (a workflow, its input, checks on the outcome) run once per
version of the agents, and compared: success, cost, steps and duration, side by side.

A version is a ModelVersion (trusted configuration: the model, provider, instructions or script it gives
named agents); "current agents" is the registry as it is. A case may name a single-agent baseline
workflow doing the same task: a *baseline* evaluation runs the cases on those instead, and the
comparison sets each version beside it (seed 003: a fan-out must pay for its cost in success or time).
Each case runs as an ordinary run in the suite's project, so its trace, ledger and budget are all on
the run page. A case is judged when its run ends or stops for a human (run_transition calls
``eval_judge_run``); pages only read.
"""

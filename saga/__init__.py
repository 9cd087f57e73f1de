"""The saga: the supervisor's executor of a run's approved proposals, and the compensation of what a stopped
run committed (saga/compensation.py, saga/executor.py, saga/sweeps.py)."""

"""Domain errors of the engine. The API maps them to HTTP codes in one handler."""


class WardenError(Exception):
    code = "error"


class NotFound(WardenError):
    code = "not_found"


class InvalidInput(WardenError):
    code = "invalid_input"

    def __init__(self, message: str, errors: list[dict] | None = None):
        super().__init__(message)
        self.errors = errors or []


class Conflict(WardenError):
    code = "conflict"


class LeaseLost(WardenError):
    """This attempt's lease was taken over, or the task left the running state: it may write nothing."""

    code = "lease_lost"


class StepFailure(WardenError):
    """A step failed; ``failure_class`` decides whether the engine retries it."""

    failure_class = "permanent"

    def __init__(self, message: str, failure_class: str | None = None):
        super().__init__(message)
        if failure_class:
            self.failure_class = failure_class


class TransientFailure(StepFailure):
    failure_class = "transient"


class BudgetRefused(Conflict):
    """An external agent's call refused because its run is past a budget (the run needs attention)."""

    code = "budget_exceeded"


class BudgetExceeded(StepFailure):
    failure_class = "budget"

    def __init__(self, budget: str, used, limit, scope: str = "run"):
        self.budget, self.used, self.limit, self.scope = budget, used, limit, scope
        super().__init__(f"{scope} budget exceeded: {budget} ({used} of {limit})")


class Forbidden(WardenError):
    """The caller is known but may not do this."""

    code = "forbidden"

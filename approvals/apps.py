from django.apps import AppConfig

from core import bus, hooks


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import actors  # noqa: F401  (registered in every process)
        from .announce import approval_requested
        from .breaker_pages import breaker_opened_heard, breaker_pages_sweep
        from .expiry import approvals_and_notifications_sweep
        from .plans import plan_hold
        from .questions import question_for_operation, questions_sweep, questions_withdraw

        # The policy app, the broker and the engine call these inside their transactions, by name (core.hooks).
        hooks.provide(hooks.APPROVAL_REQUESTED, approval_requested)
        hooks.provide(hooks.PLAN_HOLD, plan_hold)
        hooks.provide(hooks.QUESTION_FOR_OPERATION, question_for_operation)
        hooks.provide(hooks.QUESTIONS_WITHDRAW, questions_withdraw)
        hooks.add_sweep(approvals_and_notifications_sweep)
        hooks.add_sweep(questions_sweep)
        # A breaker that opens pages the people who own what it stops (approvals/breaker_pages.py).
        bus.on_breaker_opened(breaker_opened_heard)
        hooks.add_sweep(breaker_pages_sweep)

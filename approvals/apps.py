from django.apps import AppConfig

from core import bus, hooks


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import actors  # noqa: F401  (registered in every process)
        from .breaker_pages import breaker_opened_heard, breaker_pages_sweep
        from .expiry import approvals_and_notifications_sweep
        from .plans import plan_hold
        from .questions import question_for_operation, questions_sweep
        from .services import (
            approval_request_for_operation,
            approval_request_for_operations,
            approvals_withdraw,
            approvals_withdraw_ids,
            policies_in_force,
        )

        # The broker and the engine call these inside their transactions, by name (core.hooks).
        hooks.provide(hooks.APPROVAL_REQUEST_FOR_OPERATION, approval_request_for_operation)
        hooks.provide(hooks.POLICIES_IN_FORCE, policies_in_force)
        hooks.provide(hooks.APPROVAL_REQUEST_FOR_OPERATIONS, approval_request_for_operations)
        hooks.provide(hooks.APPROVALS_WITHDRAW, approvals_withdraw)
        hooks.provide(hooks.APPROVALS_WITHDRAW_IDS, approvals_withdraw_ids)
        hooks.provide(hooks.PLAN_HOLD, plan_hold)
        hooks.provide(hooks.QUESTION_FOR_OPERATION, question_for_operation)
        hooks.add_sweep(approvals_and_notifications_sweep)
        hooks.add_sweep(questions_sweep)
        # A breaker that opens pages the people who own what it stops (approvals/breaker_pages.py).
        bus.on_breaker_opened(breaker_opened_heard)
        hooks.add_sweep(breaker_pages_sweep)
        from django.db import transaction
        from django.db.models.signals import post_save

        from runs.evals import eval_start_for_change

        from .models import ApprovalPolicy

        def policy_saved(sender, instance, raw=False, **kwargs):
            # A policy has no numbered versions: each save is a new one, and the suites naming it run.
            if not raw:
                name = instance.name
                transaction.on_commit(lambda: eval_start_for_change(kind="policy", name=name, version="(saved)"))

        post_save.connect(policy_saved, sender=ApprovalPolicy, dispatch_uid="approvals.evals.policy", weak=False)

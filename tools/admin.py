"""Admin for the ledger and the sandbox systems. Ledger statuses change only through the broker and
the saga engine (the actions below); secret argument values never appear here."""

from django.contrib import admin

from runs.admin import ProjectScoped, ReadOnlyAdmin, _apply

from .models import (
    SandboxCall,
    SandboxDeployment,
    SandboxDocument,
    SandboxEmail,
    SandboxRecord,
    SandboxRecordChange,
    SandboxTicket,
    SealedArguments,
    ToolOperation,
)
from .saga import operation_resolve


@admin.register(ToolOperation)
class ToolOperationAdmin(ProjectScoped, ReadOnlyAdmin):
    list_display = [
        "id",
        "run",
        "task",
        "step",
        "kind",
        "tool",
        "status",
        "tool_class",
        "reversibility",
        "committed_at",
    ]
    list_filter = ["status", "kind", "tool", "tool_class", "reversibility", "proposed"]
    search_fields = ["=id", "=run__id", "idempotency_key", "tool", "external_id", "status_reason"]
    list_select_related = ["run", "task"]
    actions = ["resolve_committed", "resolve_not_committed"]

    def _resolve(self, request, queryset, committed: bool):
        note = f"checked by {request.user}"
        _apply(self, request, queryset, operation_resolve, id_arg="operation_id", committed=committed, note=note)

    @admin.action(description="Resolve the selected ambiguous operations: the effect happened")
    def resolve_committed(self, request, queryset):
        self._resolve(request, queryset, committed=True)

    @admin.action(description="Resolve the selected ambiguous operations: the effect did not happen")
    def resolve_not_committed(self, request, queryset):
        self._resolve(request, queryset, committed=False)


@admin.register(SealedArguments)
class SealedArgumentsAdmin(ProjectScoped, ReadOnlyAdmin):
    project_path = "task__run__project"

    """Which calls had secret arguments; the values themselves are not shown."""

    list_display = ["id", "task", "step", "secret_fields"]
    search_fields = ["=task__id"]
    fields = ["task", "step", "secret_fields"]

    @admin.display(description="secret fields")
    def secret_fields(self, obj):
        return ", ".join(sorted(obj.values))


@admin.register(SandboxCall)
class SandboxCallAdmin(ReadOnlyAdmin):
    list_display = ["id", "system", "tool", "operation", "idempotency_key", "is_effect", "object_id", "created_at"]
    list_filter = ["system", "tool", "is_effect"]
    search_fields = ["idempotency_key", "tool", "object_id"]


@admin.register(SandboxTicket)
class SandboxTicketAdmin(admin.ModelAdmin):
    list_display = ["ticket_id", "customer_id", "title", "status", "created_at", "closed_at"]
    list_filter = ["status"]
    search_fields = ["ticket_id", "customer_id", "title", "idempotency_key"]


@admin.register(SandboxRecord)
class SandboxRecordAdmin(admin.ModelAdmin):
    list_display = ["customer_id", "name", "tier", "version"]
    search_fields = ["customer_id", "name"]


@admin.register(SandboxRecordChange)
class SandboxRecordChangeAdmin(ReadOnlyAdmin):
    list_display = ["id", "record", "kind", "version", "idempotency_key", "created_at"]
    list_filter = ["kind"]
    search_fields = ["idempotency_key", "record__customer_id"]


@admin.register(SandboxEmail)
class SandboxEmailAdmin(ReadOnlyAdmin):
    list_display = ["message_id", "to", "subject", "kind", "idempotency_key", "created_at"]
    list_filter = ["kind"]
    search_fields = ["message_id", "to", "subject", "idempotency_key"]


@admin.register(SandboxDeployment)
class SandboxDeploymentAdmin(admin.ModelAdmin):
    list_display = ["service", "version", "pods", "region"]
    search_fields = ["service"]


@admin.register(SandboxDocument)
class SandboxDocumentAdmin(admin.ModelAdmin):
    list_display = ["id", "title"]
    search_fields = ["title", "body"]

"""Agents, model prices and versions: shared configuration (the workflows' admin is the engine's, in
runs/admin.py: its action starts runs)."""

from django.contrib import admin

from tenancy.admin_scope import GlobalConfigAdmin

from .forms import AgentForm
from .models import Agent, AgentVersion, ModelPrice, ModelVersion, WorkflowVersion
from .prices import price_set_by_admin


class AgentVersionInline(admin.TabularInline):
    """Each saved change of the agent; runs keep the version they started with."""

    model = AgentVersion
    extra = 0
    can_delete = False
    fields = ["number", "created_at", "config"]
    readonly_fields = fields
    ordering = ["-number"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        # A replay's draft is its project's (replay/, scoped there), not the shared agent's history.
        return super().get_queryset(request).filter(draft=False)


@admin.register(Agent)
class AgentAdmin(GlobalConfigAdmin):
    """Agents are shared by every project (their tools are trusted configuration): superusers edit them.
    Saving a change makes a new version; runs in flight keep the one they started with."""

    form = AgentForm
    inlines = [AgentVersionInline]
    list_display = ["slug", "name", "provider", "model", "is_planner", "max_attempts"]
    list_filter = ["provider", "is_planner"]
    search_fields = ["slug", "name", "instructions"]


@admin.register(ModelPrice)
class ModelPriceAdmin(GlobalConfigAdmin):
    """Prices come from the genai-prices package (agents/prices.py); one an admin saves is theirs, and
    refresh_model_prices leaves it. Deleting it hands the model back to the package."""

    list_display = ["provider", "model", "input_usd_per_mtok", "output_usd_per_mtok", "source", "source_version"]
    list_filter = ["provider", "source"]
    search_fields = ["model"]
    readonly_fields = ["source", "source_version", "updated_at"]

    def save_through_service(self, request, obj, form, change) -> None:
        price_set_by_admin(obj)
        super().save_through_service(request, obj, form, change)


@admin.register(ModelVersion)
class ModelVersionAdmin(GlobalConfigAdmin):
    list_display = ["slug", "name"]
    search_fields = ["slug", "name"]


class _VersionAdmin(GlobalConfigAdmin):
    """Versions are records: made by saving an agent or a workflow, never edited."""

    change_action = None
    add_action = None
    delete_action = None
    readonly_fields = ["number", "config", "digest", "created_at"]

    def get_queryset(self, request):
        # Drafts tried in replays belong to the replay's project: only a superuser sees them all here.
        rows = super().get_queryset(request)
        return rows if request.user.is_superuser else rows.filter(draft=False)


@admin.register(AgentVersion)
class AgentVersionAdmin(_VersionAdmin):
    list_display = ["agent", "number", "created_at"]
    list_filter = ["agent"]
    search_fields = ["agent__slug"]


@admin.register(WorkflowVersion)
class WorkflowVersionAdmin(_VersionAdmin):
    list_display = ["workflow", "number", "created_at"]
    list_filter = ["workflow"]
    search_fields = ["workflow__slug"]

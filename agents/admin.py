"""Agents, model prices and versions: shared configuration (the workflows' admin is the engine's, in
runs/admin.py: its action starts runs)."""

from django import forms
from django.contrib import admin

from tenancy.admin_scope import GlobalConfigAdmin
from tools.secrets import SECRET_NAME

from .models import Agent, AgentVersion, ModelPrice, ModelVersion, WorkflowVersion
from .prices import price_set_by_admin
from .providers import endpoint_key_problems


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


class AgentForm(forms.ModelForm):
    base_url = forms.URLField(
        required=False, max_length=500, assume_scheme="https", help_text=Agent._meta.get_field("base_url").help_text
    )

    class Meta:
        model = Agent
        fields = "__all__"

    def clean(self):
        data = super().clean()
        name, project = data.get("api_key_secret") or "", data.get("project")
        openai = Agent.Provider.OPENAI in (data.get("provider"), data.get("fallback_provider"))
        for field in ("base_url", "api_key_secret", "send_max_tokens"):
            if data.get(field) and not openai:
                self.add_error(field, "only an OpenAI-compatible provider (or fallback) has its own endpoint")
        if name and not SECRET_NAME.fullmatch(name):
            self.add_error("api_key_secret", "a secret's name: upper case letters, digits and _")
        elif name and project is None:
            self.add_error("project", f"the project the key {name} is granted to")
        elif name and not self.errors:
            endpoint = {"api_key_secret": name, "project_id": project.id}
            for problem in endpoint_key_problems(endpoint, project_id=project.id):
                self.add_error("api_key_secret", problem)
        return data


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

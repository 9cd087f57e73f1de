from django.contrib import admin, messages

from core.errors import WardenError
from runs.services import run_start
from tenancy.access import authorize, default_project
from tenancy.admin_scope import GlobalConfigAdmin, ScopedAdmin

from .models import Agent, ModelPrice, ModelVersion, Workflow


@admin.register(Agent)
class AgentAdmin(GlobalConfigAdmin):
    """Agents are shared by every project (their tools are trusted configuration): superusers edit them."""

    list_display = ["slug", "name", "provider", "model", "is_planner", "max_attempts"]
    list_filter = ["provider", "is_planner"]
    search_fields = ["slug", "name", "instructions"]


@admin.register(ModelPrice)
class ModelPriceAdmin(GlobalConfigAdmin):
    list_display = ["provider", "model", "input_usd_per_mtok", "output_usd_per_mtok"]
    list_filter = ["provider"]
    search_fields = ["model"]


@admin.register(ModelVersion)
class ModelVersionAdmin(GlobalConfigAdmin):
    list_display = ["slug", "name"]
    search_fields = ["slug", "name"]


@admin.register(Workflow)
class WorkflowAdmin(ScopedAdmin):
    """A project's workflows are its admins' to configure (tool policies, the agents a planner may
    assign); shared workflows (no project) are a superuser's."""

    project_path = "project"
    shared_rows = True
    change_action = add_action = delete_action = "administer"
    list_display = ["slug", "name", "project", "planner", "planner_agent", "max_tasks", "max_concurrent_tasks"]
    list_filter = ["planner", "project"]
    search_fields = ["slug", "name", "description"]
    actions = ["start_runs"]

    @admin.action(description="Start a run of each selected workflow (default goal and budget)")
    def start_runs(self, request, queryset):

        for workflow in queryset:
            project = workflow.project or default_project()
            try:
                authorize(request.user, project.id, "start", what=f"project {project.slug}", request=request)
                who = {"started_by": request.user, "via": "admin", "request": request}
                run = run_start(workflow=workflow.slug, project=project, **who)
            except WardenError as exc:
                self.message_user(request, f"{workflow.slug}: {exc}", messages.ERROR)
                continue
            self.message_user(request, f"{workflow.slug}: started run {run.id}", messages.SUCCESS)

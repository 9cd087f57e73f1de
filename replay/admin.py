"""Admin of replays: read-only (started by `manage.py replay`, the API or the pages), seen by their
project's members."""

from django.contrib import admin

from runs.admin import RunData

from .models import Replay, ReplayRun, Shadow


class ReplayRunInline(admin.TabularInline):
    model = ReplayRun
    extra = 0
    fields = ["original", "run"]
    readonly_fields = ["original", "run"]
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Replay)
class ReplayAdmin(RunData):
    project_path = "project"
    list_display = ["id", "project", "candidate_version", "created_by", "created_at"]
    list_filter = ["project"]
    inlines = [ReplayRunInline]


@admin.register(Shadow)
class ShadowAdmin(RunData):
    """Read-only: a shadow is switched on and off through the API or `manage.py shadow`, audited there (and
    the workflow's list of shadowing projects kept with it)."""

    project_path = "project"
    list_display = ["id", "project", "workflow", "replay", "on", "switched_on_at", "switched_off_at"]
    list_filter = ["project", "on"]

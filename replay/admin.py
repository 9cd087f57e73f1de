"""Admin of replays: read-only (started by `manage.py replay`, the API or the pages), seen by their
project's members."""

from django.contrib import admin, messages

from core.errors import WardenError
from runs.admin import RunData
from tenancy.access import authorize

from .models import Replay, ReplayRun, Shadow
from .shadows import shadow_off


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
    """Read-only but for switching off (at 3 a.m., from wherever the operator is): a shadow is switched on
    through the API or `manage.py shadow`, each audited (and the workflow's list of shadowing projects kept
    with it)."""

    project_path = "project"
    list_display = ["id", "project", "workflow", "replay", "on", "skipped", "switched_on_at", "switched_off_at"]
    list_filter = ["project", "on"]
    actions = ["switch_off"]

    @admin.action(description="Switch the selected shadows off (their twins still going stop now)")
    def switch_off(self, request, queryset):
        done = 0
        for shadow in queryset:
            try:  # the role first: one who may not switch it off is refused (and audited) whatever its state
                authorize(request.user, shadow.project_id, "operate", what=f"shadow {shadow.id}", request=request)
                if shadow.on:
                    shadow_off(shadow=shadow, actor=request.user, via="admin", request=request)
                    done += 1
            except WardenError as exc:
                self.message_user(request, f"{shadow}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"{done} switched off", messages.SUCCESS)

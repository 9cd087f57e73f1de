from django.contrib import admin

from .models import SandboxCall


@admin.register(SandboxCall)
class SandboxCallAdmin(admin.ModelAdmin):
    list_display = ["id", "system", "tool", "operation", "idempotency_key", "is_effect", "created_at"]
    list_filter = ["system", "tool", "is_effect"]
    search_fields = ["idempotency_key", "tool"]
    readonly_fields = [f.name for f in SandboxCall._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

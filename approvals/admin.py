from django.contrib import admin, messages

from runs.errors import WardenError

from .models import ApiToken, ApprovalRequest
from .services import approval_decide
from .tokens import api_token_create, api_token_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "expires_at", "revoked_at"]
    list_filter = ["revoked_at", "expires_at"]
    search_fields = ["prefix", "name", "user__username"]
    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at", "revoked_at"]
    fields = ["user", "name", "expires_at", "prefix", "token_hash", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["name", "expires_at"])
            return
        token, raw = api_token_create(user=obj.user, name=obj.name, expires_at=obj.expires_at)
        obj.pk = token.pk
        obj.refresh_from_db()
        messages.warning(request, f"The new token is {raw} — copy it now, it will not be shown again.")

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            api_token_revoke(token=token)


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "kind", "status", "requested_at", "decided_by", "decided_at"]
    list_filter = ["status", "kind"]
    search_fields = ["=id", "=run__id", "summary", "note"]
    readonly_fields = ["run", "task", "kind", "status", "summary", "requested_at", "decided_at", "decided_by", "note"]
    actions = ["approve", "reject"]

    def has_add_permission(self, request):
        return False

    def _decide(self, request, queryset, approve: bool):
        for approval in queryset:
            try:
                approval_decide(request_id=approval.id, user=request.user, approve=approve, note="in the admin")
            except WardenError as exc:
                self.message_user(request, f"{approval}: {exc}", messages.ERROR)

    @admin.action(description="Approve the selected requests")
    def approve(self, request, queryset):
        self._decide(request, queryset, True)

    @admin.action(description="Reject the selected requests")
    def reject(self, request, queryset):
        self._decide(request, queryset, False)

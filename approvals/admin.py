"""The approvals app's admin: questions, notifications, decision links and breaker pages, and the admin of
two policy models whose actions are the reviewer's work — approval requests (decided here, through the
same service as the queue) and approval policies (saved through the four-eyes rules of
approvals/policies.py). Their pages are under /admin/policy/ (the models' app); the others of the policy
app register in policy/admin.py."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from core.errors import WardenError
from policy.admin import DecisionInline
from policy.models import ApprovalPolicy, ApprovalRequest
from tenancy.access import authorize
from tenancy.admin_scope import GovernedAdmin, ReadOnlyScopedAdmin

from .models import BreakerNotification, DecisionLink, Notification, Question
from .policies import policy_delete, policy_problems, policy_save
from .services import approval_decide


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyScopedAdmin):
    """Read-only, decided through the actions: each decision quotes the arguments hash of what the
    confirmation page showed, like a decision in the queue or through the API."""

    project_path = "run__project"
    list_display = ["id", "run", "kind", "parent", "status", "quorum", "requested_at", "expires_at", "decided_at"]
    list_filter = ["status", "kind"]
    search_fields = ["=id", "=run__id", "summary", "note"]
    inlines = [DecisionInline]
    readonly_fields = [
        "run",
        "task",
        "parent",
        "kind",
        "status",
        "quorum",
        "admins_only",
        "requested_by",
        "summary",
        "arguments_hash",
        "requested_at",
        "expires_at",
        "decided_at",
        "decided_by",
        "note",
    ]
    actions = ["approve", "reject"]

    def _decide(self, request, queryset, approve: bool):
        """First a page that shows each request as it stands (its summary and arguments hash); only its
        confirmation decides, bound to those hashes. Refused rows are said and audited at once."""
        allowed = []
        for approval in queryset.select_related("run"):
            try:
                authorize(
                    request.user,
                    approval.run.project_id,
                    "decide",
                    what=f"approval request {approval.id}",
                    request=request,
                )
                allowed.append(approval)
            except WardenError as exc:
                self.message_user(request, f"{approval}: {exc}", messages.ERROR)
        if not allowed:
            return None
        action = "approve" if approve else "reject"
        note = request.POST.get("note", "").strip()
        if request.POST.get("confirm") == "yes":
            for approval in allowed:
                try:
                    approval_decide(
                        request_id=approval.id,
                        user=request.user,
                        approve=approve,
                        note=note or ("in the admin" if approve else ""),
                        seen_hash=request.POST.get(f"hash-{approval.id}", ""),
                        request=request,
                    )
                    self.message_user(request, f"{approval}: {action}d", messages.SUCCESS)
                except WardenError as exc:
                    self.message_user(request, f"{approval}: {exc}", messages.ERROR)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": f"{action.capitalize()} approval requests",
            "requests": allowed,
            "decision": action,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/approvals/decide_confirm.html", context)

    @admin.action(description="Approve the selected requests")
    def approve(self, request, queryset):
        return self._decide(request, queryset, True)

    @admin.action(description="Reject the selected requests")
    def reject(self, request, queryset):
        return self._decide(request, queryset, False)


class ApprovalPolicyForm(forms.ModelForm):
    class Meta:
        model = ApprovalPolicy
        fields = "__all__"

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        for name, value in data.items():
            setattr(self.instance, name, value)
        for field, message in policy_problems(self.instance):
            self.add_error(field if field in self.fields else None, message)
        return data


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(GovernedAdmin):
    """A project's policies and waivers are its admins' to write; policies of every project (no project)
    are a superuser's. Every change is audited; one that loosens the rules (a waiver, a policy disabled
    or weakened) waits for a second admin of the project (approvals/policies.py)."""

    form = ApprovalPolicyForm
    project_path = "project"
    shared_rows = True
    change_action = add_action = delete_action = "administer"
    list_display = ["name", "effect", "enabled", "project", "workflow", "tool", "quorum", "expires_after_seconds"]
    list_filter = ["effect", "enabled", "on_expiry", "on_reject", "project"]
    search_fields = ["name", "tool"]

    def save_through_service(self, request, obj, form, change):
        try:
            held = policy_save(user=request.user, row=obj, fields=list(form.fields), request=request)
        except WardenError as exc:
            raise PermissionDenied(str(exc)) from exc
        if held is not None:
            self.held(request, held)

    def delete_through_service(self, request, obj):
        held = policy_delete(user=request.user, row=obj, request=request)
        if held is not None:
            self.held(request, held)


@admin.register(BreakerNotification)
class BreakerNotificationAdmin(ReadOnlyScopedAdmin):
    """Pages sent about opened circuit breakers: a project's own tools' to its members; the deployment's
    (no project) to superusers."""

    project_path = "project"
    list_display = ["id", "breaker", "project", "channel", "opened_at", "sent_at", "error"]
    list_filter = ["channel", "kind"]
    search_fields = ["breaker", "name", "error"]


@admin.register(Notification)
class NotificationAdmin(ReadOnlyScopedAdmin):
    project_path = "request__run__project"

    list_display = ["id", "request", "channel", "kind", "created_at", "sent_at", "error"]
    list_filter = ["channel", "kind"]
    search_fields = ["=request__id", "error"]


@admin.register(DecisionLink)
class DecisionLinkAdmin(ReadOnlyScopedAdmin):
    """Which links were sent and spent; the nonce is not shown (with the signature it makes the link)."""

    project_path = "request__run__project"
    list_display = ["id", "request", "created_at", "used_at", "used_by"]
    search_fields = ["=request__id"]
    exclude = ["nonce"]
    readonly_fields = ["request", "arguments_hash", "created_at", "used_at", "used_by"]


@admin.register(Question)
class QuestionAdmin(ReadOnlyScopedAdmin):
    """Listed here; answered in the inbox, on the question's card or through the API (one service)."""

    project_path = "run__project"
    list_display = ["id", "run", "task", "status", "created_at", "expires_at", "answered_by", "answered_at"]
    list_filter = ["status", "on_timeout"]
    search_fields = ["=id", "=run__id", "text", "answer"]
    readonly_fields = [
        "run",
        "task",
        "step",
        "operation",
        "text",
        "choices",
        "on_timeout",
        "status",
        "answer",
        "answered_by",
        "answered_at",
        "created_at",
        "expires_at",
    ]

"""Admin of the integrations: webhook endpoints and their delivery log, OpenTelemetry traces taken in and
the export's cursor, the API's Idempotency-Key records. Their pages were under /admin/runs/ before this
app had them; config/urls.py sends those URLs here for good."""

from django import forms
from django.contrib import admin, messages

from core.outbound import url_refusal
from tenancy.admin_scope import ReadOnlyScopedAdmin, ScopedInline, SuperuserAdmin, SuperuserReadOnlyAdmin
from tenancy.audit import audit

from .models import IdempotencyKey, OtlpExportCursor, OtlpTrace, WebhookDelivery, WebhookEndpoint
from .webhooks import webhook_endpoint_save, webhook_redeliver


@admin.register(OtlpExportCursor)
class OtlpExportCursorAdmin(SuperuserReadOnlyAdmin):
    """How far the live OTLP export has gone (a superuser may delete it to start again from now)."""

    list_display = ["last_span_id", "since"]


@admin.register(OtlpTrace)
class OtlpTraceAdmin(ReadOnlyScopedAdmin):
    """Which run each OpenTelemetry trace sent to Warden became (integrations/otlp_ingest.py): seen by
    the run's project's members, deleted only by a superuser (a data fix)."""

    project_path = "run__project"
    list_display = ["trace_id", "run", "project", "created_at"]
    search_fields = ["trace_id"]


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(SuperuserReadOnlyAdmin):
    list_display = ["key", "status", "response_status", "created_at", "locked_at"]
    list_filter = ["status"]
    search_fields = ["key"]
    exclude = ["scope"]  # a hash of the caller's credentials: nothing to read in it


class DeliveryInline(ScopedInline, admin.TabularInline):
    model = WebhookDelivery
    fields = ["event", "status", "attempts", "last_status_code", "delivered_at", "created_at"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    ordering = ["-id"]
    show_change_link = True


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https")

    class Meta:
        model = WebhookEndpoint
        fields = ["url", "secret", "project", "events", "active"]

    def clean_url(self):
        url = self.cleaned_data["url"]
        why = url_refusal(url)
        if why:
            raise forms.ValidationError(why)
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(SuperuserAdmin):
    """Only superusers: an endpoint receives every event of the projects it covers."""

    form = WebhookEndpointForm
    list_display = ["url", "project", "events", "active", "created_at"]
    list_filter = ["active", "project"]
    inlines = [DeliveryInline]

    def get_readonly_fields(self, request, obj=None):
        return ["secret_hint"] if obj else []

    def get_fields(self, request, obj=None):
        # The secret is written once; afterwards only its first characters are shown.
        return ["url", "project", "events", "active", "secret_hint"] if obj else ["url", "secret", "project", "events"]

    @admin.display(description="secret")
    def secret_hint(self, obj):
        return f"{obj.secret[:4]}…"

    def save_through_service(self, request, obj, form, change):
        webhook_endpoint_save(endpoint=obj, actor=request.user, created=not change, request=request)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(SuperuserReadOnlyAdmin):
    """The delivery log; "send again" requeues a delivery with a fresh count of attempts."""

    list_display = ["id", "event", "endpoint", "status", "attempts", "last_status_code", "delivered_at", "created_at"]
    list_filter = ["status", "event"]
    search_fields = ["event", "endpoint__url", "last_error"]
    actions = ["redeliver"]

    @admin.action(description="Send the selected deliveries again")
    def redeliver(self, request, queryset):
        for delivery in queryset:
            webhook_redeliver(delivery_id=delivery.id)
            audit(actor=request.user, action="webhook_redeliver", target=f"delivery {delivery.id}", request=request)
        self.message_user(request, f"{queryset.count()} queued again", messages.SUCCESS)

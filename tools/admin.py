"""Admin for the tools' classifications and the sandbox systems (the ledger's admin is the engine's, in
runs/admin.py: its actions are the engine's services)."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied

from core.errors import WardenError
from tenancy.admin_scope import (
    GovernedAdmin,
    ReadOnlyScopedAdmin,
    ScopedInline,
    SuperuserAdmin,
    SuperuserReadOnlyAdmin,
)
from tenancy.governance import second_admin_needed
from tenancy.models import ChangeRequest

from .classifications import classification_refusal, tool_classification_remove, tool_classification_set
from .governance import (
    classification_below_declaration,
    declaration_save,
    mcp_server_loosenings,
    mcp_tool_class_refusal,
)
from .http_tools import http_tool_problems
from .mcp_tools import (
    McpRefused,
    McpUnreachable,
    mcp_listing_problems,
    mcp_server_list,
    mcp_server_problems,
    mcp_tools_store,
)
from .models import (
    HttpTool,
    Installation,
    McpServer,
    McpTool,
    SandboxCall,
    SandboxDeployment,
    SandboxDocument,
    SandboxEmail,
    SandboxRecord,
    SandboxRecordChange,
    SandboxTicket,
    ToolClassification,
)


class ToolClassificationForm(forms.ModelForm):
    class Meta:
        model = ToolClassification
        fields = ["project", "tool", "tool_class", "reversibility", "approval", "note"]

    def clean(self):
        data = super().clean()
        tool = data.get("tool", self.instance.tool if self.instance.pk else "")
        asked = {"tool_class": data.get("tool_class", ""), "reversibility": data.get("reversibility", "")}
        errors = classification_refusal(tool=tool, approval=data.get("approval", ""), **asked)
        project = data.get("project") or (self.instance.project if self.instance.project_id else None)
        if not errors and project is not None:
            errors = classification_below_declaration(project.id, tool, **asked)
            errors += mcp_tool_class_refusal(project.id, tool, **asked)
        for error in errors:
            field = error["field"] if error["field"] in self.fields else None
            self.add_error(field, error["message"])
        return data


@admin.register(ToolClassification)
class ToolClassificationAdmin(GovernedAdmin):
    """What a project says its agents' own tools do, and the class its admins confirm for an MCP tool;
    written by its admins, each change audited; one that asks less waits for a second admin."""

    form = ToolClassificationForm
    project_path = "project"
    change_action = add_action = delete_action = "administer"
    list_display = ["tool", "project", "tool_class", "reversibility", "approval", "classified_by", "classified_at"]
    list_filter = ["project", "tool_class", "reversibility", "approval"]
    search_fields = ["tool", "note"]
    fields = ["project", "tool", "tool_class", "reversibility", "approval", "note"]

    def get_readonly_fields(self, request, obj=None):
        return ["project", "tool"] if obj else []

    def save_through_service(self, request, obj, form, change):
        try:
            saved = tool_classification_set(
                user=request.user,
                project=obj.project,
                tool=obj.tool,
                tool_class=obj.tool_class,
                reversibility=obj.reversibility,
                approval=obj.approval,
                note=obj.note,
                request=request,
            )
        except WardenError as exc:
            raise PermissionDenied(str(exc)) from exc
        if isinstance(saved, ChangeRequest):
            self.held(request, saved)
        else:
            obj.pk = saved.pk

    def delete_through_service(self, request, obj):
        held = tool_classification_remove(user=request.user, row=obj, request=request)
        if held is not None:
            self.held(request, held)


class _CheckedForm(forms.ModelForm):
    """A declaration checked as a whole on save: ``problems(row)`` gives (field, message) pairs, and any
    one of them keeps the row from being saved."""

    def problems(self, row) -> list[tuple[str | None, str]]:
        raise NotImplementedError

    def clean(self):
        data = super().clean()
        for name, field in self.fields.items():
            # JSON null passes a blank JSON field's own check, and the column refuses it (a 500 at save).
            column = self.instance._meta.get_field(name) if isinstance(field, forms.JSONField) else None
            if column is not None and not column.null and name in data and data[name] is None:
                empty = column.get_default()
                what = "a list, or [] for none" if isinstance(empty, list) else "an object, or {} for none"
                self.add_error(name, what)
        if self.errors:
            return data
        for name, value in data.items():
            setattr(self.instance, name, value)
        for field, message in self.problems(self.instance):
            self.add_error(field if field in self.fields else None, message)
        return data


class HttpToolForm(_CheckedForm):
    class Meta:
        model = HttpTool
        fields = "__all__"

    def problems(self, row):
        return http_tool_problems(row)


@admin.register(HttpTool)
class HttpToolAdmin(GovernedAdmin):
    """A project's HTTP tools: declared by its admins, checked on save, each change audited; a change of
    its target, headers or class that loosens waits for a second admin."""

    form = HttpToolForm
    project_path = "project"
    change_action = add_action = delete_action = "administer"
    list_display = ["name", "project", "method", "url", "tool_class", "reversibility", "on_refusal", "enabled"]
    list_filter = ["project", "tool_class", "on_refusal", "enabled"]
    search_fields = ["name", "url", "description"]

    def save_through_service(self, request, obj, form, change):
        held = declaration_save(user=request.user, row=obj, fields=list(form.fields), request=request)
        if held is not None:
            self.held(request, held)


class McpToolInline(ScopedInline, admin.TabularInline):
    """What the server listed when it was last saved; the class comes from its annotations (a tool
    classification of the same name can make it stricter)."""

    model = McpTool
    extra = 0
    can_delete = False
    fields = ["name", "remote_name", "tool_class", "reversibility", "annotations", "description"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class McpServerForm(_CheckedForm):
    request = None  # set by McpServerAdmin.get_form: the listing is audited as the request's user's

    class Meta:
        model = McpServer
        fields = ["project", "name", "transport", "url", "command", "headers", "secrets", "timeout_seconds",
                  "on_refusal", "enabled"]  # fmt: skip

    def problems(self, server):
        """Checked, then asked for its tools (an outbound call, audited): a server that does not answer
        is not saved. A change of its address that waits for a second admin is only checked: it is asked
        for its tools once approved."""
        self.listed = None
        user = getattr(self.request, "user", None)
        before = McpServer.objects.filter(id=server.pk).first() if server.pk else None
        if mcp_server_loosenings(before, server) and second_admin_needed(user, server.project_id):
            return mcp_server_problems(server)
        try:
            self.listed = mcp_server_list(server=server, user=getattr(self.request, "user", None), request=self.request)
        except McpRefused as exc:
            return exc.problems
        except McpUnreachable as exc:
            return [(None, str(exc)[:300])]
        return mcp_listing_problems(server, self.listed)


@admin.register(McpServer)
class McpServerAdmin(GovernedAdmin):
    """A project's MCP servers: saving one lists its tools again; a change of its address, headers or
    secrets waits for a second admin (and is listed when approved)."""

    form = McpServerForm
    project_path = "project"
    change_action = add_action = delete_action = "administer"
    list_display = ["name", "project", "transport", "url", "command", "on_refusal", "enabled", "listed_at"]
    list_filter = ["project", "transport", "on_refusal", "enabled"]
    inlines = [McpToolInline]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)  # a new class for each request
        form.request = request
        return form

    def save_through_service(self, request, obj, form, change):
        held = declaration_save(user=request.user, row=obj, fields=list(form.fields), request=request)
        if held is not None:
            self.held(request, held)
        elif form.listed is not None:
            mcp_tools_store(obj, form.listed)


@admin.register(McpTool)
class McpToolAdmin(ReadOnlyScopedAdmin):
    """The tools MCP servers listed: changed only by saving their server again. The class shown is the
    server's suggestion; until a project admin confirms a class (the action below, or a tool
    classification of the same name) every call of the tool waits for a reviewer."""

    project_path = "server__project"
    list_display = ["name", "server", "tool_class", "reversibility", "confirmed_class", "remote_name"]
    list_filter = ["server__project", "tool_class"]
    search_fields = ["name", "remote_name", "description"]
    readonly_fields = ["server", "name", "remote_name", "description", "input_schema", "annotations",
                       "tool_class", "reversibility", "confirmed_class"]  # fmt: skip
    actions = ["confirm_suggested_class"]

    @admin.display(description="confirmed class")
    def confirmed_class(self, obj):
        row = ToolClassification.objects.filter(project_id=obj.server.project_id, tool=obj.name).first()
        return f"{row.tool_class} {row.reversibility}".strip() if row else "unclassified: every call waits"

    @admin.action(description="Confirm the class the server suggests (project admins)")
    def confirm_suggested_class(self, request, queryset):
        for tool in queryset.select_related("server__project"):
            try:
                saved = tool_classification_set(
                    user=request.user,
                    project=tool.server.project,
                    tool=tool.name,
                    tool_class=tool.tool_class,
                    reversibility=tool.reversibility,
                    note="the server's suggestion, confirmed in the admin",
                    request=request,
                )
            except WardenError as exc:
                self.message_user(request, f"{tool.name}: {exc}", messages.ERROR)
                continue
            if isinstance(saved, ChangeRequest):
                self.message_user(request, f"{tool.name}: asks less than now, so it waits for another admin "
                                  f"(change request {saved.id})", messages.WARNING)  # fmt: skip
            else:
                self.message_user(request, f"{tool.name}: {saved.tool_class} {saved.reversibility}".strip())


@admin.register(Installation)
class InstallationAdmin(SuperuserReadOnlyAdmin):
    """The id every idempotency key starts with: never edited here (WARDEN_INSTALLATION_ID overrides it)."""

    list_display = ["key", "legacy_runs_through", "created_at"]

    def has_delete_permission(self, request, obj=None):
        return False  # a new id would make every key new: a retried step would call again


@admin.register(SandboxCall)
class SandboxCallAdmin(SuperuserReadOnlyAdmin):
    list_display = ["id", "system", "tool", "operation", "idempotency_key", "is_effect", "object_id", "created_at"]
    list_filter = ["system", "tool", "is_effect"]
    search_fields = ["idempotency_key", "tool", "object_id"]


@admin.register(SandboxTicket)
class SandboxTicketAdmin(SuperuserAdmin):
    list_display = ["ticket_id", "customer_id", "title", "status", "created_at", "closed_at"]
    list_filter = ["status"]
    search_fields = ["ticket_id", "customer_id", "title", "idempotency_key"]


@admin.register(SandboxRecord)
class SandboxRecordAdmin(SuperuserAdmin):
    list_display = ["customer_id", "name", "tier", "version"]
    search_fields = ["customer_id", "name"]


@admin.register(SandboxRecordChange)
class SandboxRecordChangeAdmin(SuperuserReadOnlyAdmin):
    list_display = ["id", "record", "kind", "version", "idempotency_key", "created_at"]
    list_filter = ["kind"]
    search_fields = ["idempotency_key", "record__customer_id"]


@admin.register(SandboxEmail)
class SandboxEmailAdmin(SuperuserReadOnlyAdmin):
    list_display = ["message_id", "to", "subject", "kind", "idempotency_key", "created_at"]
    list_filter = ["kind"]
    search_fields = ["message_id", "to", "subject", "idempotency_key"]


@admin.register(SandboxDeployment)
class SandboxDeploymentAdmin(SuperuserAdmin):
    list_display = ["service", "version", "pods", "region"]
    search_fields = ["service"]


@admin.register(SandboxDocument)
class SandboxDocumentAdmin(SuperuserAdmin):
    list_display = ["id", "title"]
    search_fields = ["title", "body"]

"""The admin's half of the access table (tenancy/access.py, docs/access.md).

Every admin page of project data answers by the user's role in each row's project, for view, change,
add and delete, exactly as the dashboard and the API do. Django's model permissions are needed too and
never widen it: a staff member holding every permission on a model still sees and changes only what
their roles allow. What is not any project's data (engine internals, the sandbox systems, users, shared
configuration) is a superuser's. Saves and deletes go through a service, which writes the audit log.
"""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpResponseRedirect
from django.urls import reverse

from .access import ACTIONS, project_ids, role_of
from .audit import audit
from .models import Project

SUPERUSER = "superuser"  # an action only superusers have


def _project_of(obj, path: str) -> int | None:
    """The project id at the end of ``path`` ("run__project"; "pk": the object is the project)."""
    if path == "pk":
        return obj.pk
    *hops, last = path.split("__")
    for hop in hops:
        obj = getattr(obj, hop, None)
        if obj is None:
            return None
    return getattr(obj, f"{last}_id", None)


def _label(obj) -> str:
    return f"{obj._meta.label_lower} {obj.pk}"


def _projects(request, action: str) -> list[int]:
    """The projects where the request's user may ``action``, looked up once per request: the admin asks
    every registered page's permissions to draw its menu."""
    cache = request.__dict__.setdefault("_warden_projects", {})
    if action not in cache:
        cache[action] = project_ids(request.user, action)
    return cache[action]


def _role(request, project_id: int) -> str | None:
    """The request's user's role in a project, looked up once per request (a page asks for each row it
    shows, and for each of its inlines)."""
    cache = request.__dict__.setdefault("_warden_roles", {})
    if project_id not in cache:
        cache[project_id] = role_of(request.user, project_id)
    return cache[project_id]


def config_save(*, actor, obj, created: bool, changed=(), project_id=None, request=None) -> None:
    """Save a row changed in the admin (a data fix, or a project's configuration), and say so in the
    audit log, with the row's project."""
    obj.save()
    audit(
        actor=actor,
        action="admin:add" if created else "admin:change",
        project_id=project_id,
        target=_label(obj),
        request=request,
        detail={"object": str(obj)[:200], "changed": sorted(changed)},
    )


def config_delete(*, actor, obj, project_id=None, request=None) -> None:
    label, shown = _label(obj), str(obj)[:200]
    obj.delete()
    audit(
        actor=actor,
        action="admin:delete",
        project_id=project_id,
        target=label,
        request=request,
        detail={"object": shown},
    )


class ScopedAdmin(admin.ModelAdmin):
    """``project_path``: from a row to its project (None: no project's data, a superuser's). Each
    ``*_action`` names the role action of tenancy/access.py a user needs in the row's project: None
    nobody (read-only: state changes go through the page's actions), ``SUPERUSER`` superusers only.
    ``shared_rows``: rows without a project (shared configuration) are shown to every member, changed by
    superusers only. ``global_view``: a model of no project (shared configuration, like agents) that
    every member of some project may see."""

    project_path: str | None = None
    view_action: str | None = "view"
    change_action: str | None = None
    add_action: str | None = None
    delete_action: str | None = SUPERUSER
    shared_rows = False
    global_view = False

    # --- who may ---------------------------------------------------------------------------------

    def may(self, request, action: str | None, obj=None) -> bool:
        user = request.user
        if action is None or not (user.is_active and user.is_staff):
            return False
        if user.is_superuser:
            return True
        if action == SUPERUSER:
            return False
        if self.project_path is None:
            return self.global_view and action == self.view_action and bool(_projects(request, action))
        if obj is None:  # a list or an add form: somewhere they may
            return bool(_projects(request, action))
        project_id = _project_of(obj, self.project_path)
        if project_id is None:
            return self.shared_rows and action == self.view_action
        return _role(request, project_id) in ACTIONS[action][0]

    def rows_for(self, request, action: str | None, rows=None):
        """``rows`` (all of the model's) narrowed to the projects where the user may ``action``."""
        rows = self.model._default_manager.all() if rows is None else rows
        user = request.user
        if user.is_superuser:
            return rows
        if action in (None, SUPERUSER) or not user.is_staff:
            return rows.none()
        if self.project_path is None:
            return rows if self.may(request, action) else rows.none()
        field = "pk" if self.project_path == "pk" else self.project_path
        where = Q(**{f"{field}__in": _projects(request, action)})
        if self.shared_rows:
            where |= Q(**{f"{field}__isnull": True})
        return rows.filter(where)

    def get_queryset(self, request):
        return self.rows_for(request, self.view_action, super().get_queryset(request))

    def has_module_permission(self, request):
        return self.may(request, self.view_action) and super().has_module_permission(request)

    def has_view_permission(self, request, obj=None):
        return self.may(request, self.view_action, obj) and super().has_view_permission(request, obj)

    def has_change_permission(self, request, obj=None):
        return self.may(request, self.change_action, obj) and super().has_change_permission(request, obj)

    def has_add_permission(self, request, *args):
        return self.may(request, self.add_action) and super().has_add_permission(request, *args)

    def has_delete_permission(self, request, obj=None):
        return self.may(request, self.delete_action, obj) and super().has_delete_permission(request, obj)

    # --- forms: choices limited to where the user may act, saves through services ------------------

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if not request.user.is_superuser:
            action = self.change_action or self.add_action
            related = db_field.related_model
            if related is Project:  # and no shared (project-less) row: those are a superuser's
                editable = action not in (None, SUPERUSER) and request.user.is_staff
                kwargs["queryset"] = Project.objects.filter(id__in=_projects(request, action) if editable else [])
                kwargs["required"] = True
            elif isinstance(self.admin_site._registry.get(related), ScopedAdmin):
                kwargs["queryset"] = self.admin_site._registry[related].rows_for(request, action)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj, form, change):
        # The new values too: a row moved to another project needs the role there.
        if not self.may(request, self.change_action if change else self.add_action, obj):
            raise PermissionDenied("your role in that project may not do this")
        self.save_through_service(request, obj, form, change)

    def save_through_service(self, request, obj, form, change) -> None:
        config_save(
            actor=request.user,
            obj=obj,
            created=not change,
            changed=form.changed_data,
            project_id=self.project_of(obj),
            request=request,
        )

    def project_of(self, obj) -> int | None:
        return _project_of(obj, self.project_path) if self.project_path else None

    def delete_model(self, request, obj):
        if not self.may(request, self.delete_action, obj):
            raise PermissionDenied("your role in that project may not delete this")
        self.delete_through_service(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)

    def delete_through_service(self, request, obj) -> None:
        config_delete(actor=request.user, obj=obj, project_id=self.project_of(obj), request=request)

    def save_formset(self, request, form, formset, change):
        """Inline rows (the cases of a suite): saved with their parent, each change in the audit log."""
        if not self.may(request, self.change_action if change else self.add_action, form.instance):
            raise PermissionDenied("your role in that project may not do this")
        saved = formset.save()
        for obj in [*saved, *formset.deleted_objects]:
            audit(
                actor=request.user,
                action="admin:delete" if obj in formset.deleted_objects else "admin:change",
                project_id=self.project_of(form.instance),
                target=_label(obj),
                request=request,
                detail={"object": str(obj)[:200], "inline of": _label(form.instance)},
            )


class GovernedAdmin(ScopedAdmin):
    """A project's rules (tools, classifications, policies): a save or delete that loosens them may open
    a change request for a second admin instead (tenancy/governance.py). ``save_through_service`` and
    ``delete_through_service`` hand the request they opened to ``held``; the page then says so, and
    nothing is logged as changed."""

    def held(self, request, change) -> None:
        request._warden_change_request = change

    def _held_response(self, request):
        change = getattr(request, "_warden_change_request", None)
        if change is None:
            return None
        self.message_user(
            request,
            f"This change loosens the project's rules ({'; '.join(change.loosens)}): nothing changed yet. It "
            f"waits for another admin of the project as change request {change.id} (the reviewer queue).",
            messages.WARNING,
        )
        opts = self.model._meta
        return HttpResponseRedirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))

    def response_add(self, request, obj, post_url_continue=None):
        return self._held_response(request) or super().response_add(request, obj, post_url_continue)

    def response_change(self, request, obj):
        return self._held_response(request) or super().response_change(request, obj)

    def response_delete(self, request, obj_display, obj_id):
        return self._held_response(request) or super().response_delete(request, obj_display, obj_id)

    def log_addition(self, request, obj, message):
        if not hasattr(request, "_warden_change_request"):
            return super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        if not hasattr(request, "_warden_change_request"):
            return super().log_change(request, obj, message)


class ScopedInline:
    """An inline (mixed into TabularInline / StackedInline) edited with its parent: what the parent's
    admin allows on the parent row, never more."""

    def _parent(self):
        return self.admin_site._registry[self.parent_model]

    def has_view_permission(self, request, obj=None):
        return self._parent().has_view_permission(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._parent().has_change_permission(request, obj)

    def has_add_permission(self, request, obj=None):
        return self._parent().has_change_permission(request, obj) if obj else self._parent().has_add_permission(request)

    def has_delete_permission(self, request, obj=None):
        return self._parent().has_change_permission(request, obj)


class SuperuserAdmin(ScopedAdmin):
    """No project's data: a superuser's to see and change."""

    view_action = SUPERUSER
    change_action = SUPERUSER
    add_action = SUPERUSER


class SuperuserReadOnlyAdmin(SuperuserAdmin):
    """Engine internals and logs: a superuser's to read (and delete, as a data fix)."""

    change_action = None
    add_action = None


class GlobalConfigAdmin(SuperuserAdmin):
    """Configuration shared by every project (agents, prices): every member may read it, superusers
    change it."""

    view_action = "view"
    global_view = True


class ReadOnlyScopedAdmin(ScopedAdmin):
    """Project data nobody edits here: the page's actions go through the engine's services."""

    change_action = None
    add_action = None

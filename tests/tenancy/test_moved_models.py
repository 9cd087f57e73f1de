"""Projects, memberships, tokens and the audit log moved from the approvals app to tenancy: a database made
before the move keeps its rows and the permissions granted on them."""

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [
    ("approvals", "0012_token_admin_scope"),
    ("runs", "0014_ops_lease_token"),
    ("tools", "0005_gate_verdicts_and_classifications"),
    ("agents", "0009_workflow_agents"),
    ("tenancy", None),
    ("contenttypes", "0002_remove_content_type_name"),  # applied already: the models of that time
    ("auth", "0012_alter_user_first_name_max_length"),
]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state([node for node in targets if node[1]]).apps


@pytest.mark.django_db(transaction=True)
def test_rows_and_permissions_made_before_the_move_are_kept():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        old = _migrate(BEFORE)
        # What an installation had before the move, written with the models of that time.
        Permission, User = old.get_model("auth", "Permission"), old.get_model("auth", "User")
        OldContentType = old.get_model("contenttypes", "ContentType")
        project_type, _ = OldContentType.objects.get_or_create(app_label="approvals", model="project")
        may_view, _ = Permission.objects.get_or_create(
            content_type=project_type, codename="view_project", defaults={"name": "Can view project"}
        )
        pat = User.objects.create(username="pat")
        pat.user_permissions.add(may_view)
        project = old.get_model("approvals", "Project").objects.create(slug="payments", name="Payments")
        old.get_model("approvals", "Membership").objects.create(project=project, user=pat, role="viewer")
        old.get_model("approvals", "AuditEvent").objects.create(action="login", actor_label="pat")
    finally:
        _migrate(latest)
        ContentType.objects.clear_cache()

    from django.contrib.auth.models import User as NowUser

    from tenancy.models import AuditEvent, Membership, Project

    pat = NowUser.objects.get(username="pat")
    assert pat.has_perm("tenancy.view_project")  # the permission followed its model
    assert not ContentType.objects.filter(app_label="approvals", model="project").exists()
    assert Membership.objects.get(user=pat).project == Project.objects.get(slug="payments")
    assert AuditEvent.objects.filter(action="login", actor_label="pat").exists()


def test_old_admin_links_of_the_moved_models_redirect_to_their_new_place(admin_client):
    response = admin_client.get("/admin/approvals/project/3/change/?_changelist_filters=q")
    assert response.status_code == 302
    assert response["Location"] == "/admin/tenancy/project/3/change/?_changelist_filters=q"
    assert admin_client.get("/admin/approvals/approvalpolicy/").status_code == 200  # still approvals'

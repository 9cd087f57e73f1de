"""Projects, memberships, tokens and the audit log moved from the approvals app to tenancy: a database made
before the move keeps its rows and the permissions granted on them."""

import pytest
from django.contrib.contenttypes.models import ContentType

from tests.migrating import granted_before, migrated_back

BEFORE = [
    ("approvals", "0012_token_admin_scope"),
    ("runs", "0014_ops_lease_token"),
    ("tools", "0005_gate_verdicts_and_classifications"),
    ("agents", "0009_workflow_agents"),
    ("tenancy", None),
    ("contenttypes", "0002_remove_content_type_name"),  # applied already: the models of that time
    ("auth", "0012_alter_user_first_name_max_length"),
]


@pytest.mark.django_db(transaction=True)
def test_rows_and_permissions_made_before_the_move_are_kept():
    with migrated_back(BEFORE) as old:
        # What an installation had before the move, written with the models of that time.
        pat = granted_before(old, app_label="approvals", model="project", codename="view_project")
        project = old.get_model("approvals", "Project").objects.create(slug="payments", name="Payments")
        old.get_model("approvals", "Membership").objects.create(project=project, user=pat, role="viewer")
        old.get_model("approvals", "AuditEvent").objects.create(action="login", actor_label="pat")

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
    assert admin_client.get("/admin/approvals/breakernotification/").status_code == 200  # still approvals'

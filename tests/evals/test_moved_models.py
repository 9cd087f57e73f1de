"""The evaluations' models moved from the engine (runs) to the evals app with their tables: a database
made before the move keeps its rows and the permissions granted on them, and old admin links land."""

import pytest
from django.contrib.contenttypes.models import ContentType

from tests.migrating import granted_before, migrated_back

BEFORE = [
    ("evals", None),
    ("runs", "0025_eval_accepted_quarantine"),
    ("tenancy", "0002_governance_change_requests"),  # as it is (the state of the projects' rows)
    ("contenttypes", "0002_remove_content_type_name"),
    ("auth", "0012_alter_user_first_name_max_length"),
]


@pytest.mark.django_db(transaction=True)
def test_rows_and_permissions_made_before_the_move_are_kept():
    with migrated_back(BEFORE) as old:
        granted_before(old, app_label="runs", model="evalsuite", codename="view_evalsuite")
        project = old.get_model("tenancy", "Project").objects.create(slug="payments", name="Payments")
        old.get_model("runs", "EvalSuite").objects.create(slug="nightly", name="Nightly", project=project)

    from django.contrib.auth.models import User as NowUser

    from evals.models import EvalSuite

    assert NowUser.objects.get(username="pat").has_perm("evals.view_evalsuite")  # the permission followed
    assert not ContentType.objects.filter(app_label="runs", model="evalsuite").exists()
    assert EvalSuite.objects.get(slug="nightly").project.slug == "payments"


def test_old_admin_links_of_the_moved_models_redirect_for_good(admin_client):
    response = admin_client.get("/admin/runs/evalsuite/3/change/?_changelist_filters=q")
    assert response.status_code == 301
    assert response["Location"] == "/admin/evals/evalsuite/3/change/?_changelist_filters=q"
    for model in ("evalcase", "evalrun", "evalresult", "annotation"):
        assert admin_client.get(f"/admin/runs/{model}/")["Location"] == f"/admin/evals/{model}/"
    assert admin_client.get("/admin/evals/evalsuite/").status_code == 200
    assert admin_client.get("/admin/runs/run/").status_code == 200  # the engine's pages stay

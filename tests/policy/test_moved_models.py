"""Approval policies, allow rules, approval requests and decisions moved from the approvals app to policy: a
database made before the move keeps its rows and the permissions granted on them, and the admin's old URLs
(a public contract) redirect for good to the new ones."""

import pytest
from django.contrib.contenttypes.models import ContentType

from tests.migrating import granted_before, migrated_back

BEFORE = [
    ("approvals", "0019_lifetime_of_earlier_rules"),
    ("tools", "0011_tool_refusals"),
    ("policy", None),
]


@pytest.mark.django_db(transaction=True)
def test_rows_and_permissions_made_before_the_move_are_kept():
    with migrated_back(BEFORE) as old:
        granted_before(old, app_label="approvals", model="approvalpolicy", codename="change_approvalpolicy")
        old.get_model("approvals", "ApprovalPolicy").objects.create(name="refunds over 100", tool="refund.create")

    from django.contrib.auth.models import User as NowUser

    from policy.models import ApprovalPolicy

    pat = NowUser.objects.get(username="pat")
    assert pat.has_perm("policy.change_approvalpolicy")  # the permission followed its model
    assert not ContentType.objects.filter(app_label="approvals", model="approvalpolicy").exists()
    assert ApprovalPolicy.objects.get(name="refunds over 100").tool == "refund.create"


@pytest.mark.parametrize("model", ["approvalpolicy", "allowrule", "approvalrequest", "decision"])
def test_old_admin_urls_of_the_moved_models_redirect_for_good(admin_client, model):
    response = admin_client.get(f"/admin/approvals/{model}/3/change/?_changelist_filters=q")
    assert response.status_code == 301  # permanent: the old paths are deprecated
    assert response["Location"] == f"/admin/policy/{model}/3/change/?_changelist_filters=q"
    listing = admin_client.get(f"/admin/approvals/{model}/")
    assert (listing.status_code, listing["Location"]) == (301, f"/admin/policy/{model}/")
    assert admin_client.get(f"/admin/policy/{model}/").status_code == 200


def test_the_admin_pages_that_stay_in_approvals_do_not_move(admin_client):
    for model in ("notification", "decisionlink", "breakernotification", "question"):
        assert admin_client.get(f"/admin/approvals/{model}/").status_code == 200

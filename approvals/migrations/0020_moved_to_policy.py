"""Approval policies and waivers, allow rules, approval requests and decisions now belong to the policy app;
their tables keep their names (approvals_*). Notifications and decision links point at the same table."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0019_lifetime_of_earlier_rules"),
        ("policy", "0001_initial"),
        ("tools", "0012_approval_request_in_policy"),
    ]

    operations = [
        # The tables stay where they are: only Django's idea of which app owns the models changes.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="notification",
                    name="request",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="notifications",
                        to="policy.approvalrequest",
                    ),
                ),
                migrations.AlterField(
                    model_name="decisionlink",
                    name="request",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="links", to="policy.approvalrequest"
                    ),
                ),
                migrations.DeleteModel(name="Decision"),
                migrations.DeleteModel(name="ApprovalRequest"),
                migrations.DeleteModel(name="AllowRule"),
                migrations.DeleteModel(name="ApprovalPolicy"),
            ],
        ),
    ]

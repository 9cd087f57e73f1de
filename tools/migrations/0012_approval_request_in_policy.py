"""The approval request a ledger row waits for is now the policy app's model (same table): state only."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("policy", "0001_initial"),
        ("tools", "0011_tool_refusals"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="tooloperation",
                    name="approval",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="operations",
                        to="policy.approvalrequest",
                    ),
                ),
            ],
        ),
    ]

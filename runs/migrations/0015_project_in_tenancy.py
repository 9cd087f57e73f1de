"""Project moved to the tenancy app (its table keeps its name): the foreign keys follow, in Django's state only."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0014_ops_lease_token"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        # The tables stay where they are: only Django's idea of which app owns the models changes.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="evalsuite",
                    name="project",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="eval_suites", to="tenancy.project"
                    ),
                ),
                migrations.AlterField(
                    model_name="run",
                    name="project",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="runs",
                        to="tenancy.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="webhookendpoint",
                    name="project",
                    field=models.ForeignKey(
                        blank=True,
                        help_text="Empty: every project",
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="tenancy.project",
                    ),
                ),
            ],
        ),
    ]

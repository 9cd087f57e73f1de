"""Project moved to the tenancy app (its table keeps its name): the foreign keys follow, in Django's state only."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0009_workflow_agents"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        # The tables stay where they are: only Django's idea of which app owns the models changes.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="workflow",
                    name="project",
                    field=models.ForeignKey(
                        blank=True,
                        help_text="Runs start in this project; empty: shared, runs start in the default project or the one asked for",
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="workflows",
                        to="tenancy.project",
                    ),
                ),
            ],
        ),
    ]

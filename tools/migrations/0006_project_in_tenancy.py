"""Project moved to the tenancy app (its table keeps its name): the foreign keys follow, in Django's state only."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0001_initial"),
        ("tools", "0005_gate_verdicts_and_classifications"),
    ]

    operations = [
        # The tables stay where they are: only Django's idea of which app owns the models changes.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="toolclassification",
                    name="project",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="tool_classes", to="tenancy.project"
                    ),
                ),
            ],
        ),
    ]

"""Projects, memberships, API tokens and the audit log now belong to the tenancy app; their tables keep their names."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0010_project_in_tenancy"),
        ("approvals", "0012_token_admin_scope"),
        ("runs", "0015_project_in_tenancy"),
        ("tenancy", "0001_initial"),
        ("tools", "0006_project_in_tenancy"),
    ]

    operations = [
        # The tables stay where they are: only Django's idea of which app owns the models changes.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="approvalpolicy",
                    name="project",
                    field=models.ForeignKey(
                        blank=True,
                        help_text="Empty: all",
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="tenancy.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="allowrule",
                    name="project",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="allow_rules", to="tenancy.project"
                    ),
                ),
                migrations.DeleteModel(
                    name="ApiToken",
                ),
                migrations.DeleteModel(
                    name="AuditEvent",
                ),
                migrations.DeleteModel(
                    name="Membership",
                ),
                migrations.DeleteModel(
                    name="Project",
                ),
            ],
        ),
    ]

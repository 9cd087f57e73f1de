import django.db.models.deletion
from django.db import migrations, models


def into_default_project(apps, schema_editor):
    """Runs made before projects existed belong to the default project."""
    Project = apps.get_model("approvals", "Project")
    Run = apps.get_model("runs", "Run")
    if Run.objects.filter(project__isnull=True).exists():
        project, _ = Project.objects.get_or_create(slug="default", defaults={"name": "Default"})
        Run.objects.filter(project__isnull=True).update(project=project)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0003_projects_scopes_audit"),
        ("runs", "0002_run_ops_lease"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="project",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.PROTECT, related_name="runs", to="approvals.project"
            ),
        ),
        migrations.RunPython(into_default_project, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="run",
            name="project",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="runs", to="approvals.project"
            ),
        ),
    ]

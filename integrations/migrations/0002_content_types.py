# The moved models' content types follow them (runs → integrations), so their permissions, the admin's
# log entries and anything else that names them by content type stay attached.

from django.db import migrations

MOVED = ["idempotencykey", "otlpexportcursor", "otlptrace", "webhookdelivery", "webhookendpoint"]


def _relabel(apps, source: str, target: str) -> None:
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        # A content type already made under the new label (a stray post_migrate) is left as it is.
        if not ContentType.objects.filter(app_label=target, model=model).exists():
            ContentType.objects.filter(app_label=source, model=model).update(app_label=target)


def forwards(apps, schema_editor):
    _relabel(apps, "runs", "integrations")


def backwards(apps, schema_editor):
    _relabel(apps, "integrations", "runs")


class Migration(migrations.Migration):

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('integrations', '0001_initial'),
        ('runs', '0026_integrations_moved_out'),
    ]

    operations = [migrations.RunPython(forwards, backwards)]

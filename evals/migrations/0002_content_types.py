"""The moved models' content types follow them (runs → evals), so their permissions, the admin's log
entries and any generic relation keep pointing at the same rows."""

from django.db import migrations

MOVED = ["evalsuite", "evalcase", "evalrun", "evalresult", "annotation"]


def relabel(from_label: str, to_label: str):
    def apply(apps, schema_editor):
        ContentType = apps.get_model("contenttypes", "ContentType")
        db = schema_editor.connection.alias
        taken = set(ContentType.objects.using(db).filter(app_label=to_label).values_list("model", flat=True))
        moving = ContentType.objects.using(db).filter(app_label=from_label, model__in=MOVED)
        moving.exclude(model__in=taken).update(app_label=to_label)

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("evals", "0001_initial"),
        ("runs", "0027_evals_moved_out"),
    ]

    operations = [migrations.RunPython(relabel("runs", "evals"), relabel("evals", "runs"))]

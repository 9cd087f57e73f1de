# Webhooks, OTLP traces and Idempotency-Key records moved to the integrations app, keeping their tables
# (integrations 0001 took them into its state): the engine's state lets go of them; nothing in the database changes.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0025_eval_accepted_quarantine'),
        ('integrations', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='IdempotencyKey'),
                migrations.DeleteModel(name='OtlpExportCursor'),
                migrations.DeleteModel(name='OtlpTrace'),
                migrations.DeleteModel(name='WebhookDelivery'),
                migrations.DeleteModel(name='WebhookEndpoint'),
            ],
            database_operations=[],
        ),
    ]

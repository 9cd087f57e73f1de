# The integrations' models were the engine's (runs 0006, 0007, 0017, 0018): they move here keeping their tables
# (Meta.db_table), so this migration changes the state only; runs 0026 removes them from the engine's state.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('runs', '0025_eval_accepted_quarantine'),
        ('tenancy', '0002_governance_change_requests'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='OtlpExportCursor',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('last_span_id', models.BigIntegerField(default=0)),
                        ('since', models.DateTimeField()),
                    ],
                    options={
                        'db_table': 'runs_otlpexportcursor',
                    },
                ),
                migrations.CreateModel(
                    name='IdempotencyKey',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('scope', models.CharField(help_text="SHA-256 of the caller's credentials", max_length=64)),
                        ('key', models.CharField(max_length=255)),
                        ('fingerprint', models.CharField(help_text='SHA-256 of method, path and body', max_length=64)),
                        ('status', models.CharField(choices=[('in_flight', 'In Flight'), ('done', 'Done')], default='in_flight', max_length=16)),
                        ('response_status', models.PositiveSmallIntegerField(blank=True, null=True)),
                        ('response_body', models.TextField(blank=True)),
                        ('response_type', models.CharField(blank=True, max_length=100)),
                        ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                        ('locked_at', models.DateTimeField(help_text='When the request holding it started (or took it over)')),
                    ],
                    options={
                        'db_table': 'runs_idempotencykey',
                        'ordering': ['-id'],
                        'constraints': [models.UniqueConstraint(fields=('scope', 'key'), name='idempotency_key_unique_per_caller')],
                    },
                ),
                migrations.CreateModel(
                    name='WebhookEndpoint',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('url', models.URLField(max_length=500)),
                        ('secret', models.CharField(help_text='Shared secret of the HMAC-SHA256 signature', max_length=200)),
                        ('events', models.JSONField(blank=True, default=list, help_text='Empty: all of run.finished, run.needs_attention, approval.requested, approval.decided, operation.ambiguous')),
                        ('active', models.BooleanField(default=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('project', models.ForeignKey(blank=True, help_text='Empty: every project', null=True, on_delete=django.db.models.deletion.CASCADE, to='tenancy.project')),
                    ],
                    options={
                        'db_table': 'runs_webhookendpoint',
                    },
                ),
                migrations.CreateModel(
                    name='OtlpTrace',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('trace_id', models.CharField(max_length=32)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.project')),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='otlp_traces', to='runs.run')),
                    ],
                    options={
                        'db_table': 'runs_otlptrace',
                        'constraints': [models.UniqueConstraint(fields=('project', 'trace_id'), name='one_run_per_otlp_trace')],
                    },
                ),
                migrations.CreateModel(
                    name='WebhookDelivery',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('event', models.CharField(max_length=40)),
                        ('payload', models.JSONField()),
                        ('status', models.CharField(choices=[('pending', 'Pending'), ('sending', 'Sending'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='pending', max_length=16)),
                        ('attempts', models.PositiveIntegerField(default=0)),
                        ('next_attempt_at', models.DateTimeField(db_index=True)),
                        ('claimed_at', models.DateTimeField(blank=True, null=True)),
                        ('last_status_code', models.PositiveSmallIntegerField(blank=True, null=True)),
                        ('last_error', models.TextField(blank=True)),
                        ('delivered_at', models.DateTimeField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('endpoint', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='integrations.webhookendpoint')),
                    ],
                    options={
                        'db_table': 'runs_webhookdelivery',
                        'ordering': ['-id'],
                        'indexes': [models.Index(fields=['status', 'next_attempt_at'], name='runs_webhoo_status_9259a1_idx')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]

"""Projects, memberships, API tokens and the audit log, moved here from the approvals app: the tables
(approvals_*) are kept as they are, with their rows, constraints and the audit log's append-only trigger."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


MOVED = ["project", "membership", "apitoken", "auditevent"]


def content_types_follow(apps, schema_editor):
    """Permissions granted on these models (groups, users) stay granted: their content types move too."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not ContentType.objects.filter(app_label="tenancy", model=model).exists():
            ContentType.objects.filter(app_label="approvals", model=model).update(app_label="tenancy")


def content_types_back(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    ContentType.objects.filter(app_label="tenancy", model__in=MOVED).update(app_label="approvals")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('approvals', '0012_token_admin_scope'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('runs', '0014_ops_lease_token'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # The tables stay where they are: only Django's idea of which app owns the models changes.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Project',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('slug', models.SlugField(max_length=64, unique=True)),
                        ('name', models.CharField(max_length=200)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        'db_table': 'approvals_project',
                        'ordering': ['slug'],
                    },
                ),
                migrations.CreateModel(
                    name='ApiToken',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('scopes', models.JSONField(blank=True, default=list, help_text='read, run, operate, approve, admin')),
                        ('for_agent', models.BooleanField(default=False, help_text='Used by an agent: can never decide approvals nor configure a project')),
                        ('name', models.CharField(blank=True, max_length=100)),
                        ('prefix', models.CharField(help_text='First characters, to recognise a token', max_length=12)),
                        ('token_hash', models.CharField(max_length=64, unique=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('last_used_at', models.DateTimeField(blank=True, null=True)),
                        ('expires_at', models.DateTimeField(blank=True, null=True)),
                        ('revoked_at', models.DateTimeField(blank=True, null=True)),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'approvals_apitoken',
                        'ordering': ['-id'],
                    },
                ),
                migrations.CreateModel(
                    name='Membership',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('role', models.CharField(choices=[('viewer', 'Viewer'), ('operator', 'Operator'), ('reviewer', 'Reviewer'), ('admin', 'Admin')], max_length=16)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to=settings.AUTH_USER_MODEL)),
                        ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to='tenancy.project')),
                    ],
                    options={
                        'db_table': 'approvals_membership',
                        'ordering': ['project', 'user'],
                        'constraints': [models.UniqueConstraint(fields=('project', 'user'), name='membership_project_user')],
                    },
                ),
                migrations.CreateModel(
                    name='AuditEvent',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('at', models.DateTimeField(auto_now_add=True, db_index=True)),
                        ('actor_label', models.CharField(blank=True, help_text='Username at the time, kept if the user goes', max_length=150)),
                        ('via', models.CharField(blank=True, max_length=16)),
                        ('action', models.CharField(db_index=True, max_length=64)),
                        ('outcome', models.CharField(default='done', max_length=16)),
                        ('target', models.CharField(blank=True, max_length=200)),
                        ('detail', models.JSONField(blank=True, default=dict)),
                        ('address', models.GenericIPAddressField(blank=True, null=True)),
                        ('actor', models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('run', models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='audit_events', to='runs.run')),
                        ('project', models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='tenancy.project')),
                    ],
                    options={
                        'db_table': 'approvals_auditevent',
                        'ordering': ['-id'],
                        'indexes': [models.Index(fields=['run', 'id'], name='approvals_a_run_id_80a30e_idx')],
                    },
                ),
            ],
        ),
        migrations.RunPython(content_types_follow, content_types_back),
    ]

"""Approval policies and waivers, allow rules, approval requests and decisions, moved here from the approvals
app: the tables (approvals_*) stay as they are, with their rows and constraints. Only Django's idea of which
app owns the models changes, and the content types follow (permissions and admin log entries stay attached)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVED = ["approvalrequest", "decision", "approvalpolicy", "allowrule"]


def content_types_follow(apps, schema_editor):
    """Permissions granted on these models (groups, users) stay granted: their content types move too."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not ContentType.objects.filter(app_label="policy", model=model).exists():
            ContentType.objects.filter(app_label="approvals", model=model).update(app_label="policy")


def content_types_back(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not ContentType.objects.filter(app_label="approvals", model=model).exists():
            ContentType.objects.filter(app_label="policy", model=model).update(app_label="approvals")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("agents", "0013_model_prices_and_endpoints"),
        ("approvals", "0019_lifetime_of_earlier_rules"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("runs", "0025_eval_accepted_quarantine"),
        ("tenancy", "0002_governance_change_requests"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # The tables exist already (the approvals app made them): state only.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='AllowRule',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('tool', models.CharField(max_length=64)),
                        ('arguments', models.JSONField(blank=True, default=dict, help_text='These arguments must have exactly these values; others may vary')),
                        ('covers_irreversible', models.BooleanField(default=False, help_text='Only an admin may set this')),
                        ('note', models.TextField(blank=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('expires_at', models.DateTimeField(help_text='Rules have a maximum lifetime (WARDEN_ALLOW_RULE_MAX_DAYS)', null=True)),
                        ('revoked_at', models.DateTimeField(blank=True, null=True)),
                        ('agent', models.ForeignKey(blank=True, help_text='Empty: any', null=True, on_delete=django.db.models.deletion.CASCADE, to='agents.agent')),
                        ('created_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='allow_rules', to='tenancy.project')),
                        ('revoked_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('run', models.ForeignKey(blank=True, help_text='Empty: any', null=True, on_delete=django.db.models.deletion.CASCADE, to='runs.run')),
                    ],
                    options={
                        'db_table': 'approvals_allowrule',
                        'ordering': ['-id'],
                    },
                ),
                migrations.CreateModel(
                    name='ApprovalPolicy',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=200)),
                        ('enabled', models.BooleanField(default=True)),
                        ('effect', models.CharField(choices=[('require', 'Calls it matches wait for reviewers'), ('waive', 'Irreversible calls it matches leave without a reviewer (a waiver)')], default='require', help_text='A waiver names its project; quorum, roles and expiry do not apply to it', max_length=8)),
                        ('tool', models.CharField(blank=True, help_text='Empty: every write tool', max_length=64)),
                        ('condition', models.JSONField(blank=True, default=dict, help_text='Optional, on an argument: {"field": "amount", "op": ">", "value": 100}')),
                        ('quorum', models.PositiveSmallIntegerField(default=1)),
                        ('decided_by_role', models.CharField(choices=[('reviewer', 'reviewers and admins'), ('admin', 'project admins only')], default='reviewer', help_text='Who may decide what this policy gates', max_length=16)),
                        ('expires_after_seconds', models.PositiveIntegerField(blank=True, null=True)),
                        ('remind_before_seconds', models.PositiveIntegerField(blank=True, null=True)),
                        ('on_expiry', models.CharField(choices=[('reject', 'Reject'), ('escalate', 'Escalate')], default='reject', max_length=16)),
                        ('on_reject', models.CharField(choices=[('tell_agent', "The agent gets 'rejected by reviewer: <comment>'"), ('fail_task', 'The task fails (the run needs attention)')], default='tell_agent', max_length=16)),
                        ('project', models.ForeignKey(blank=True, help_text='Empty: all', null=True, on_delete=django.db.models.deletion.CASCADE, to='tenancy.project')),
                        ('workflow', models.ForeignKey(blank=True, help_text='Empty: all', null=True, on_delete=django.db.models.deletion.CASCADE, to='agents.workflow')),
                    ],
                    options={
                        'verbose_name_plural': 'approval policies',
                        'db_table': 'approvals_approvalpolicy',
                        'ordering': ['id'],
                    },
                ),
                migrations.CreateModel(
                    name='ApprovalRequest',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('operation', 'One tool call'), ('bundle', 'Proposed operations, executed together'), ('correction', 'Correction actions of a compensation'), ('plan', "A planner's plan, before its tasks start")], max_length=16)),
                        ('quorum', models.PositiveSmallIntegerField(default=1, help_text='Approvals from distinct reviewers needed')),
                        ('arguments_hash', models.CharField(blank=True, help_text='Hash of the exact arguments shown; a decision must quote it', max_length=64)),
                        ('declaration', models.CharField(blank=True, max_length=64)),
                        ('status', models.CharField(choices=[('pending', 'Pending'), ('approved', 'Approved'), ('rejected', 'Rejected'), ('withdrawn', 'Withdrawn'), ('expired', 'Expired')], db_index=True, default='pending', max_length=16)),
                        ('summary', models.TextField(help_text='What will happen if approved (arguments redacted)')),
                        ('requested_at', models.DateTimeField(auto_now_add=True)),
                        ('expires_at', models.DateTimeField(blank=True, db_index=True, null=True)),
                        ('reminded_at', models.DateTimeField(blank=True, null=True)),
                        ('escalated_at', models.DateTimeField(blank=True, null=True)),
                        ('admins_only', models.BooleanField(default=False, help_text='A matching policy reserves the decision for admins')),
                        ('fail_on_reject', models.BooleanField(default=False, help_text='A matching policy fails the task on rejection')),
                        ('decided_at', models.DateTimeField(blank=True, null=True)),
                        ('note', models.TextField(blank=True)),
                        ('plan', models.JSONField(blank=True, null=True)),
                        ('decided_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('parent', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='items', to='policy.approvalrequest')),
                        ('policy', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='requests', to='policy.approvalpolicy')),
                        ('requested_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='approvals', to='runs.run')),
                        ('task', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='runs.task')),
                    ],
                    options={
                        'db_table': 'approvals_approvalrequest',
                        'ordering': ['-id'],
                    },
                ),
                migrations.CreateModel(
                    name='Decision',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('verdict', models.CharField(choices=[('approve', 'Approve'), ('reject', 'Reject')], max_length=8)),
                        ('comment', models.TextField(blank=True)),
                        ('arguments_hash', models.CharField(help_text='What the reviewer saw', max_length=64)),
                        ('edited_arguments', models.JSONField(blank=True, help_text='Approved with these arguments instead', null=True)),
                        ('at', models.DateTimeField(auto_now_add=True)),
                        ('request', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='decisions', to='policy.approvalrequest')),
                        ('reviewer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'approvals_decision',
                        'ordering': ['id'],
                    },
                ),
                migrations.AddConstraint(
                    model_name='approvalpolicy',
                    constraint=models.CheckConstraint(condition=models.Q(models.Q(('effect', 'waive'), _negated=True), ('project__isnull', False), _connector='OR'), name='a_waiver_names_a_project'),
                ),
                migrations.AddConstraint(
                    model_name='decision',
                    constraint=models.UniqueConstraint(fields=('request', 'reviewer'), name='decision_request_reviewer'),
                ),
            ],
        ),
        migrations.RunPython(content_types_follow, content_types_back),
    ]

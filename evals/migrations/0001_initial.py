"""The evaluations' models, moved from the engine (runs) with their tables: state only, no table is
created or copied (runs 0026 removes them from the engine's state)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('agents', '0013_model_prices_and_endpoints'),
        ('runs', '0025_eval_accepted_quarantine'),
        ('tenancy', '0002_governance_change_requests'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='EvalCase',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=200)),
                        ('goal', models.TextField(blank=True)),
                        ('input', models.JSONField(blank=True, default=dict)),
                        ('checks', models.JSONField(blank=True, default=list, help_text='[{"status": "completed"}, {"artifact": "verify", "contains": "APPROVE"}, {"max_cost_usd": 0.01}, {"max_steps": 20}, {"artifact": "verify", "schema": {…}}, {"artifact": "risk", "path": "score", "equals": 3}, {"artifact": "risk", "path": "score", "approx": 0.3, "tolerance": 0.05}, {"tool_called": "crm.read"}, {"tool_not_called": "email.send"}, {"no_unapproved_irreversible": true}, {"judge": {"agent": "judge-agent", "artifact": "verify", "rubric": "…", "min_score": 0.7}} (docs/evaluations.md)')),
                        ('baseline_workflow', models.ForeignKey(blank=True, help_text='A single-agent workflow doing the same task: the baseline a multi-agent workflow must beat', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='agents.workflow')),
                        ('from_run', models.ForeignKey(blank=True, help_text='The annotated run it came from', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='runs.run')),
                        ('workflow', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='agents.workflow')),
                    ],
                    options={
                        'db_table': 'runs_evalcase',
                        'ordering': ['suite', 'id'],
                    },
                ),
                migrations.CreateModel(
                    name='EvalSuite',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('slug', models.SlugField(max_length=64, unique=True)),
                        ('name', models.CharField(max_length=200)),
                        ('description', models.TextField(blank=True)),
                        ('rerun_on', models.JSONField(blank=True, default=list, help_text='Run the suite again when a new version of one of these is saved: ["agent:verifier-agent", "workflow:deploy-review", "policy:refunds over $100"]')),
                        ('project', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='eval_suites', to='tenancy.project')),
                        ('quarantine', models.ManyToManyField(blank=True, help_text='Known failures: cases of this suite whose failure does not fail run_evals (named on its page)', related_name='quarantined_in', to='evals.evalcase')),
                    ],
                    options={
                        'db_table': 'runs_evalsuite',
                        'ordering': ['slug'],
                    },
                ),
                migrations.CreateModel(
                    name='EvalRun',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('baseline', models.BooleanField(default=False, help_text='The cases ran on their single-agent baseline workflows')),
                        ('trigger', models.CharField(blank=True, help_text='What started it: the page, the API, run_evals, or a new version', max_length=200)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('accepted', models.BooleanField(default=False, help_text='run_evals exited 0 on it: the baseline later passes are compared with by default')),
                        ('started_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL)),
                        ('version', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, to='agents.modelversion')),
                        ('suite', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='eval_runs', to='evals.evalsuite')),
                    ],
                    options={
                        'db_table': 'runs_evalrun',
                        'ordering': ['-id'],
                    },
                ),
                migrations.AddField(
                    model_name='evalcase',
                    name='suite',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='cases', to='evals.evalsuite'),
                ),
                migrations.CreateModel(
                    name='Annotation',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('target', models.CharField(choices=[('run', 'Run'), ('task', 'Task'), ('span', 'Span'), ('artifact', 'Artifact')], default='run', max_length=16)),
                        ('target_id', models.BigIntegerField(blank=True, help_text='The task, span or artifact; empty: the run', null=True)),
                        ('score', models.FloatField(blank=True, help_text='0 (bad) to 1 (good)', null=True)),
                        ('comment', models.TextField(blank=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('author', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='annotations', to='runs.run')),
                    ],
                    options={
                        'db_table': 'runs_annotation',
                        'ordering': ['run', 'id'],
                        'constraints': [models.CheckConstraint(condition=models.Q(('score__isnull', True), models.Q(('score__gte', 0), ('score__lte', 1)), _connector='OR'), name='annotation_score_0_1')],
                    },
                ),
                migrations.CreateModel(
                    name='EvalResult',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('passed', models.BooleanField(help_text='Empty until the run has finished and its judges have graded', null=True)),
                        ('failures', models.JSONField(blank=True, default=list)),
                        ('grades', models.JSONField(blank=True, default=list)),
                        ('judge_cost_micros', models.BigIntegerField(default=0, help_text="What the judges' model calls cost")),
                        ('case', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='evals.evalcase')),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='runs.run')),
                        ('eval_run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='results', to='evals.evalrun')),
                    ],
                    options={
                        'db_table': 'runs_evalresult',
                        'ordering': ['eval_run', 'case'],
                        'constraints': [models.UniqueConstraint(fields=('eval_run', 'case'), name='one_result_per_case')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]

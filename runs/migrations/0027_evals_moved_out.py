"""The evaluations' models moved to the evals app with their tables (evals 0001): the engine forgets
them, state only; no table is dropped."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0026_integrations_moved_out'),
        ('evals', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='evalcase',
                    name='baseline_workflow',
                ),
                migrations.RemoveField(
                    model_name='evalcase',
                    name='from_run',
                ),
                migrations.RemoveField(
                    model_name='evalcase',
                    name='suite',
                ),
                migrations.RemoveField(
                    model_name='evalcase',
                    name='workflow',
                ),
                migrations.RemoveField(
                    model_name='evalsuite',
                    name='quarantine',
                ),
                migrations.RemoveField(
                    model_name='evalresult',
                    name='case',
                ),
                migrations.RemoveField(
                    model_name='evalresult',
                    name='eval_run',
                ),
                migrations.RemoveField(
                    model_name='evalresult',
                    name='run',
                ),
                migrations.RemoveField(
                    model_name='evalrun',
                    name='started_by',
                ),
                migrations.RemoveField(
                    model_name='evalrun',
                    name='suite',
                ),
                migrations.RemoveField(
                    model_name='evalrun',
                    name='version',
                ),
                migrations.RemoveField(
                    model_name='evalsuite',
                    name='project',
                ),
                migrations.DeleteModel(
                    name='Annotation',
                ),
                migrations.DeleteModel(
                    name='EvalCase',
                ),
                migrations.DeleteModel(
                    name='EvalResult',
                ),
                migrations.DeleteModel(
                    name='EvalRun',
                ),
                migrations.DeleteModel(
                    name='EvalSuite',
                ),
            ],
            database_operations=[],
        ),
    ]

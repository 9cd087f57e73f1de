"""The runs list's search of goals, indexed where the database can: on PostgreSQL with the pg_trgm
extension, a trigram GIN index over ``goal``, which serves the list's case-insensitive regex match of
the search text (runs/selectors/runs_list.py) however rare the phrase; a search for a phrase in one run
of a million no longer reads every goal.

Chosen when the migration runs: the extension is created if the server offers it and this role may
(pg_trgm is a trusted extension: a database owner may, since PostgreSQL 13); otherwise nothing changes
and the search reads the goals as before (SQLite, or a server without the contrib package). Running the
migration again after installing the extension is `manage.py migrate runs 0027 && manage.py migrate`.
"""

import logging

from django.db import DatabaseError, migrations, transaction

INDEX = "runs_run_goal_trgm"
log = logging.getLogger("warden.migrations")


def index_create(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            log.warning("pg_trgm is not available: the runs list's search of goals stays unindexed")
            return
        try:
            with transaction.atomic(using=connection.alias):  # a refusal must not abort the migration
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        except DatabaseError as exc:
            log.warning("pg_trgm cannot be created here (%s): the search of goals stays unindexed", exc)
            return
        cursor.execute(f"CREATE INDEX IF NOT EXISTS {INDEX} ON runs_run USING gin (goal gin_trgm_ops)")


def index_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")  # the extension stays: others may use it


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0027_evals_moved_out"),
    ]

    operations = [migrations.RunPython(index_create, index_drop, elidable=False)]

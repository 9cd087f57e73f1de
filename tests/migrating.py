"""A database taken back to the migrations it had before a change, for the tests of that change's data
migrations: rows written there with the models of that time, then migrated to the latest again."""

from contextlib import contextmanager

from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate(targets):
    """Migrate to ``targets`` ((app, name) or (app, None): none of the app's); the models of that state."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state([node for node in targets if node[1]]).apps


def as_it_was(*targets):
    """``targets`` and every other app as it is now, but those whose migrations build on a later one of
    the targets' apps (they go back with it)."""
    graph = MigrationExecutor(connection).loader.graph
    later = {
        node for node in graph.nodes for app, name in targets if node[0] == app and (name is None or node[1] > name)
    }
    now = [node for node in graph.leaf_nodes() if node[0] not in {app for app, _ in targets}]
    return [node for node in now if not later & set(graph.forwards_plan(node))] + list(targets)


@contextmanager
def migrated_back(targets):
    """The database at ``targets`` inside the block (yields the models of that time), at the latest after."""
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        yield migrate(targets)
    finally:
        migrate(latest)
        ContentType.objects.clear_cache()


def granted_before(old, *, app_label: str, model: str, codename: str):
    """A user who, before the move, was granted ``app_label.codename`` on ``model`` (the models of that time)."""
    model_type, _ = old.get_model("contenttypes", "ContentType").objects.get_or_create(app_label=app_label, model=model)
    permission, _ = old.get_model("auth", "Permission").objects.get_or_create(
        content_type=model_type, codename=codename, defaults={"name": codename.replace("_", " ")}
    )
    user = old.get_model("auth", "User").objects.create(username="pat")
    user.user_permissions.add(permission)
    return user

from django.db import migrations

# On PostgreSQL the database itself refuses to change or delete an audit row, whatever the caller.
FORBID = """
CREATE OR REPLACE FUNCTION warden_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER approvals_auditevent_append_only BEFORE UPDATE OR DELETE ON approvals_auditevent
    FOR EACH ROW EXECUTE FUNCTION warden_audit_append_only();
"""
ALLOW = """
DROP TRIGGER IF EXISTS approvals_auditevent_append_only ON approvals_auditevent;
DROP FUNCTION IF EXISTS warden_audit_append_only();
"""


def forbid(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORBID)


def allow(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ALLOW)


class Migration(migrations.Migration):
    dependencies = [("approvals", "0003_projects_scopes_audit")]

    operations = [migrations.RunPython(forbid, allow)]

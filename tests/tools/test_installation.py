"""Idempotency keys name the installation (tools/installation.py): a reset database or a second
environment never sends another installation's keys again to a shared external system."""

import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from tools import installation
from tools.broker import idempotency_key
from tools.models import Installation


@pytest.fixture
def stored(db, monkeypatch, settings):
    """No id in the settings, and nothing read yet: the one stored with the database is used."""
    settings.WARDEN = {**settings.WARDEN, "INSTALLATION_ID": ""}
    monkeypatch.setattr(installation, "_known", None)


def test_a_new_database_gets_an_id_of_its_own_once(stored):
    Installation.objects.all().delete()
    first = idempotency_key(run_id=7, task_key="worker-3", step=4)
    key = Installation.objects.get().key
    assert re.fullmatch(r"i[0-9a-f]{10}", key) and first == f"warden:{key}:7:worker-3:4"
    installation._known = None  # another process of the same installation reads the same row
    assert idempotency_key(run_id=7, task_key="worker-3", step=4) == first
    assert Installation.objects.count() == 1

    Installation.objects.all().delete()  # the database is reset: the same run id, a different key
    installation._known = None
    assert idempotency_key(run_id=7, task_key="worker-3", step=4) != first


def test_the_migration_stores_an_id_and_runs_started_before_keep_their_keys(stored, demo):
    from importlib import import_module

    from django.apps import apps

    from runs.services import run_start

    before = run_start(workflow="deploy-review")  # a run under way when Warden is upgraded
    Installation.objects.all().delete()
    import_module("tools.migrations.0007_installation").installation_create(apps, None)
    row = Installation.objects.get()
    assert row.legacy_runs_through == before.id
    assert installation.run_key_prefix(before.id) == f"warden:{before.id}:"  # its ledger rows are found again
    after = run_start(workflow="deploy-review")
    assert installation.run_key_prefix(after.id) == f"warden:{row.key}:{after.id}:"


def test_the_setting_keeps_an_installations_id_on_a_new_database(stored, settings):
    settings.WARDEN = {**settings.WARDEN, "INSTALLATION_ID": "iprod01"}
    assert idempotency_key(run_id=3, task_key="t", step=1, epoch=2) == "warden:iprod01:3:t:1:e2"


def test_a_malformed_id_in_the_setting_is_refused(stored, settings):
    settings.WARDEN = {**settings.WARDEN, "INSTALLATION_ID": "Prod:01"}
    with pytest.raises(ImproperlyConfigured, match="WARDEN_INSTALLATION_ID"):
        idempotency_key(run_id=3, task_key="t", step=1)


def test_the_command_shows_the_id_to_keep(stored, capsys):
    Installation.objects.all().delete()
    key = installation.installation()[0]
    call_command("installation_id")
    assert capsys.readouterr().out.strip() == key

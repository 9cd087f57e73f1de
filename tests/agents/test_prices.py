"""Model prices (agents/prices.py, docs/agents.md "Prices"): read from the genai-prices package (its
bundled data, no network), an admin's price wins and no refresh overwrites it."""

import io
from decimal import Decimal

from django.core.management import call_command
from django.urls import reverse

from agents.gateway import cost_micros
from agents.models import ModelPrice
from agents.prices import package_prices, package_version


def test_a_known_model_costs_what_the_package_says_without_anyone_typing_a_price(db):
    # gpt-4.1-mini: $0.40 in, $1.60 out per million tokens in the pinned package.
    assert package_prices()[("openai", "gpt-4.1-mini")] == (Decimal("0.4"), Decimal("1.6"))
    assert cost_micros("openai", "gpt-4.1-mini", 1000, 1000) == 2000
    # A dated name, matched by the package's own rules, is priced at its first use.
    assert cost_micros("anthropic", "claude-3-5-haiku-20241022", 1000, 100) == 800 + 400
    row = ModelPrice.objects.get(provider="anthropic", model="claude-3-5-haiku-20241022")
    assert (row.source, row.source_version) == ("package", package_version())
    assert cost_micros("openai", "a-model-nobody-prices", 1000, 1000) == 0  # unknown: nothing invented


def test_an_admins_price_wins_and_survives_a_refresh(admin_client, db):
    call_command("refresh_model_prices", stdout=io.StringIO())
    row = ModelPrice.objects.get(provider="openai", model="gpt-4.1-mini")
    url = reverse("admin:agents_modelprice_change", args=[row.id])
    fields = {"provider": "openai", "model": "gpt-4.1-mini"}

    refused = admin_client.post(url, {**fields, "input_usd_per_mtok": "-1", "output_usd_per_mtok": "abc"})
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert set(errors) == {"input_usd_per_mtok", "output_usd_per_mtok"}
    row.refresh_from_db()
    assert (row.input_usd_per_mtok, row.source) == (Decimal("0.4"), "package")  # nothing written

    saved = admin_client.post(url, {**fields, "input_usd_per_mtok": "0.3", "output_usd_per_mtok": "1.2"})
    assert saved.status_code == 302
    row.refresh_from_db()
    assert (row.input_usd_per_mtok, row.output_usd_per_mtok, row.source) == (Decimal("0.3"), Decimal("1.2"), "admin")

    # A package row edited behind the admin's back is put right; the admin's stays theirs.
    ModelPrice.objects.filter(provider="openai", model="gpt-4.1").update(input_usd_per_mtok=99)
    call_command("refresh_model_prices", stdout=io.StringIO())
    row.refresh_from_db()
    assert (row.input_usd_per_mtok, row.output_usd_per_mtok, row.source) == (Decimal("0.3"), Decimal("1.2"), "admin")
    assert ModelPrice.objects.get(provider="openai", model="gpt-4.1").input_usd_per_mtok == Decimal("2")
    assert cost_micros("openai", "gpt-4.1-mini", 1000, 1000) == 300 + 1200


def test_a_refresh_twice_changes_nothing_the_second_time(db, capsys):
    call_command("refresh_model_prices")
    count = ModelPrice.objects.count()
    call_command("refresh_model_prices")
    out = capsys.readouterr().out.splitlines()[-1]
    assert ModelPrice.objects.count() == count > 100
    assert out.startswith(f"genai-prices {package_version()}: 0 added, 0 updated")

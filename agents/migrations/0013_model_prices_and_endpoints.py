"""Model prices from the genai-prices package (seeded here, offline; rows that existed were an admin's
and stay theirs), and an agent's own OpenAI-compatible endpoint: its URL, its key's name and project,
and whether it takes max_tokens."""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

from agents.prices import prices_refresh


def seed_prices(apps, schema_editor):
    prices_refresh(rows=apps.get_model("agents", "ModelPrice"))


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0012_plan_approval"),
        ("tenancy", "0002_governance_change_requests"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="api_key_secret",
            field=models.CharField(
                blank=True,
                help_text="The name of the endpoint's key, a secret granted to the project below (WARDEN_SECRET_GRANTS); empty: the deployment's key, sent only to the deployment's endpoint",
                max_length=128,
            ),
        ),
        migrations.AddField(
            model_name="agent",
            name="base_url",
            field=models.URLField(
                blank=True,
                help_text="OpenAI-compatible providers: this agent's endpoint (e.g. http://10.0.0.5:8000/v1); empty: the deployment's (WARDEN_OPENAI_BASE_URL)",
                max_length=500,
            ),
        ),
        migrations.AddField(
            model_name="agent",
            name="project",
            field=models.ForeignKey(
                blank=True,
                help_text="Whose secret the key is: only this project's runs may call the endpoint with it",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="tenancy.project",
            ),
        ),
        migrations.AddField(
            model_name="agent",
            name="send_max_tokens",
            field=models.BooleanField(
                default=False,
                help_text="The endpoint takes max_tokens, not max_completion_tokens (older vLLM, Ollama, some proxies)",
            ),
        ),
        migrations.AddField(
            model_name="modelprice",
            name="source",
            field=models.CharField(
                choices=[
                    ("package", "genai-prices (refreshed by refresh_model_prices)"),
                    ("admin", "set by an admin (never overwritten)"),
                ],
                default="admin",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="modelprice",
            name="source_version",
            field=models.CharField(blank=True, help_text="The package's version it came from", max_length=32),
        ),
        migrations.AddField(
            model_name="modelprice",
            name="updated_at",
            field=models.DateTimeField(auto_now=True),
        ),
        migrations.AlterField(
            model_name="modelprice",
            name="input_usd_per_mtok",
            field=models.DecimalField(
                decimal_places=6, max_digits=14, validators=[django.core.validators.MinValueValidator(0)]
            ),
        ),
        migrations.AlterField(
            model_name="modelprice",
            name="output_usd_per_mtok",
            field=models.DecimalField(
                decimal_places=6, max_digits=14, validators=[django.core.validators.MinValueValidator(0)]
            ),
        ),
        migrations.RunPython(seed_prices, migrations.RunPython.noop),
    ]

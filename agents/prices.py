"""Model prices from a maintained source: Pydantic's genai-prices package (docs/agents.md, "Prices").

The package ships its table as Python data in the wheel, so nothing here touches the network: the
table is as fresh as the installed version (upgrading the pin and running ``refresh_model_prices``
brings new prices). Rows come from it per provider and model:

- ``prices_refresh`` writes the package's price of every model of the providers Warden calls, at
  migrate and from the management command; a row an admin set (source ``admin``) is never touched.
- ``price_get`` finds a model's row, and at first use of a model the table has no row for (a dated
  name such as ``gpt-4o-2024-08-06``, matched by the package's own rules) writes the package's.

Only the input and output token prices are read: Warden counts those two (cache and tool-use prices
are the provider's finer print). A tiered price counts at its base tier.
"""

import logging
from datetime import UTC, datetime
from decimal import Decimal
from importlib.metadata import version

from genai_prices import data_snapshot

from .models import Agent, ModelPrice

log = logging.getLogger("warden.prices")

PACKAGE = "genai-prices"
PROVIDERS = (Agent.Provider.OPENAI, Agent.Provider.ANTHROPIC)  # the package's ids are Warden's
_PLACES = Decimal("0.000001")  # the column's


def package_version() -> str:
    return version(PACKAGE)


def _usd(price) -> Decimal | None:
    price = getattr(price, "base", price)  # TieredPrices: its base tier
    return None if price is None else Decimal(price).quantize(_PLACES)


def _prices(model_info) -> tuple[Decimal, Decimal] | None:
    prices = model_info.get_prices(datetime.now(tz=UTC))
    tokens_in, tokens_out = _usd(getattr(prices, "input_mtok", None)), _usd(getattr(prices, "output_mtok", None))
    if tokens_in is None and tokens_out is None:  # priced by the image or the second: not by tokens
        return None
    return tokens_in or Decimal(0), tokens_out or Decimal(0)


def package_prices() -> dict[tuple[str, str], tuple[Decimal, Decimal]]:
    """The package's token prices (USD per million) per (provider, model id)."""
    table = {}
    for provider in data_snapshot.get_snapshot().providers:
        if provider.id not in PROVIDERS:
            continue
        for model_info in provider.models:
            if (prices := _prices(model_info)) is not None:
                table[(provider.id, model_info.id)] = prices
    return table


def package_price(provider: str, model: str) -> tuple[Decimal, Decimal] | None:
    """The package's price of ``model`` as an agent names it, by the package's matching rules."""
    if provider not in PROVIDERS or not model:
        return None
    try:
        _, model_info = data_snapshot.get_snapshot().find_provider_model(model, None, provider, None)
    except LookupError:
        return None
    return _prices(model_info)


def prices_refresh(*, rows=ModelPrice) -> dict[str, int]:
    """Write the package's prices: new models added, the package's own rows updated, an admin's rows
    left as they are. ``rows`` is the model class (a migration passes its historical one). Idempotent."""
    found, current = package_prices(), package_version()
    existing = {(row.provider, row.model): row for row in rows.objects.filter(provider__in=PROVIDERS)}
    counts = {"added": 0, "updated": 0, "kept": 0}
    for (provider, model), (tokens_in, tokens_out) in found.items():
        row = existing.get((provider, model))
        if row is None:
            rows.objects.create(provider=provider, model=model, input_usd_per_mtok=tokens_in,
                                output_usd_per_mtok=tokens_out, source="package", source_version=current)  # fmt: skip
            counts["added"] += 1
        else:
            counts[_refreshed(row, (tokens_in, tokens_out), current)] += 1
    for (provider, model), row in existing.items():  # names seeded at first use: matched again
        if (provider, model) not in found and (prices := package_price(provider, model)) is not None:
            counts[_refreshed(row, prices, current)] += 1
    return counts


def _refreshed(row, prices: tuple[Decimal, Decimal], current: str) -> str:
    if row.source != "package":
        return "kept"
    if (row.input_usd_per_mtok, row.output_usd_per_mtok, row.source_version) == (*prices, current):
        return "kept"
    row.input_usd_per_mtok, row.output_usd_per_mtok = prices
    row.source_version = current
    row.save(update_fields=["input_usd_per_mtok", "output_usd_per_mtok", "source_version", "updated_at"])
    return "updated"


def price_get(provider: str, model: str) -> ModelPrice | None:
    """The row calls of ``model`` are charged by; at its first use, the package's price if it knows one."""
    row = ModelPrice.objects.filter(provider=provider, model=model).first()
    if row is not None:
        return row
    prices = package_price(provider, model)
    if prices is None:
        return None
    row, _ = ModelPrice.objects.get_or_create(
        provider=provider,
        model=model,
        defaults={"input_usd_per_mtok": prices[0], "output_usd_per_mtok": prices[1], "source": "package",
                  "source_version": package_version()},
    )  # fmt: skip
    log.info("model %s/%s priced from %s at first use", provider, model, PACKAGE)
    return row


def price_set_by_admin(row: ModelPrice) -> None:
    """An admin's price wins over the package's: marked so before it is saved."""
    row.source = ModelPrice.Source.ADMIN
    row.source_version = ""

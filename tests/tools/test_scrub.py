"""Scrubbing that holds (tools/secrets.py ``scrub``): whatever shape a system quotes a secret back in —
a dict key, base64 in either alphabet and at any alignment inside a longer text, percent-encoded, hex —
nothing of it is left, and it is done before any cut. The deployment's own secrets are scrubbed too,
named or not. Ordinary text is left alone."""

import base64
import uuid

import httpx
import pytest

from tests.tools.hostile_echo import echoed, straddling, traces
from tools.http_tools import REFUSAL_TEXT, _answer
from tools.kit import ToolRefused
from tools.secrets import REDACTED, scrub, scrub_failure

SECRET = f"pk live/{uuid.uuid4().hex}+{uuid.uuid4().hex[:10]}=z"


def leftover(text) -> list[str]:
    return [trace for trace in traces(SECRET) if trace in str(text)]


@pytest.mark.parametrize("shape", sorted(echoed(SECRET)))
def test_every_shape_of_a_secret_is_scrubbed(shape):
    text = echoed(SECRET)[shape]
    scrubbed = scrub(f"before {text} after", [SECRET])
    assert leftover(scrubbed) == [] and REDACTED in scrubbed, scrubbed


@pytest.mark.parametrize("prefix", [b"", b"x", b"xy", b"xyz", b"some longer prefix of a record"])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_a_secret_inside_a_longer_base64_text_is_scrubbed_at_every_alignment(prefix, encode):
    raw = SECRET.encode()
    text = encode(prefix + raw + b" and the rest of the record").decode().rstrip("=")
    # The characters of the text that the secret's bytes alone decide (6 bits each).
    inside = text[-(-8 * len(prefix) // 6) : 8 * (len(prefix) + len(raw)) // 6]
    scrubbed = scrub(text, [SECRET])
    assert REDACTED in scrubbed and inside not in scrubbed
    assert not any(inside[i : i + 12] in scrubbed for i in range(len(inside) - 12))  # nor a long piece of it


def test_dict_keys_and_nested_values_are_scrubbed():
    answer = {SECRET: "header", "nested": [{"k": f"Bearer {SECRET}"}, (SECRET,)], 7: None, "plain": "refund re_1"}
    scrubbed = scrub(answer, [SECRET])
    assert scrubbed == {REDACTED: "header", "nested": [{"k": f"Bearer {REDACTED}"}, (REDACTED,)], 7: None,
                        "plain": "refund re_1"}  # fmt: skip


def test_the_deployments_own_secrets_are_scrubbed_unnamed(settings):
    assert scrub({"debug": settings.SECRET_KEY, settings.SECRET_KEY: 1}) == {"debug": REDACTED, REDACTED: 1}


def test_ordinary_text_is_left_alone():
    answer = {"refund_id": "re_123", "amount_cents": 2500, "text": "Refunded 25.00 to card_4242 on 2026-03-01"}
    assert scrub(answer, [SECRET]) == answer


def test_a_refusal_is_scrubbed_before_its_body_is_cut():
    body = straddling(SECRET)
    assert SECRET[: len(SECRET) // 2] in body[:REFUSAL_TEXT] and SECRET not in body[:REFUSAL_TEXT]  # the trap
    response = httpx.Response(400, text=body)
    with pytest.raises(ToolRefused) as refused:
        _answer(response, {"KEY": SECRET})
    assert leftover(refused.value) == [] and REDACTED in str(refused.value)


def test_a_failure_and_what_it_was_raised_from_keep_no_secret():
    try:
        try:
            raise ValueError(f"the service said: {SECRET}")
        except ValueError as cause:
            raise ToolRefused(f"refused ({base64.b64encode(SECRET.encode()).decode()})") from cause
    except ToolRefused as exc:
        failure = scrub_failure(exc, [SECRET])
    assert leftover(failure) == [] and failure.__cause__ is None and failure.__context__ is None

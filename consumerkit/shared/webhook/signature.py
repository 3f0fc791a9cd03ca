"""Signed webhooks, per the Standard Webhooks specification (https://www.standardwebhooks.com).

A signed delivery carries three headers:

=====================  ==========================================================================
``webhook-id``         the event id; signed, so it is the receiver's dedup key
``webhook-timestamp``  when this attempt was sent, in whole Unix seconds; signed, so a captured
                       request stops verifying once it is older than the receiver's tolerance
``webhook-signature``  ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, one per secret
                       the sender signs with, separated by spaces (rotation)
=====================  ==========================================================================

Secrets are written ``whsec_<base64>`` (the specification's form). :class:`WebhookSecret`
holds the decoded key and never shows it: not in ``repr``, ``str``, logs or error messages.
The sender (:class:`~consumerkit.outbox.webhook.WebhookSink`) and the receiver
(:class:`~consumerkit.webhook.WebhookReceiver`) both use this module.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets as _random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...errors import ConfigurationError

PREFIX = "whsec_"
ID = "webhook-id"
TIMESTAMP = "webhook-timestamp"
SIGNATURE = "webhook-signature"
HEADERS = frozenset({ID, TIMESTAMP, SIGNATURE})
DEFAULT_TOLERANCE = 300.0
"""Seconds a timestamp may lie in the past or the future (the specification's 5 minutes)."""


class WebhookSecret:
    """One shared secret, parsed from its ``whsec_<base64>`` form; the key is never shown."""

    __slots__ = ("_key",)

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.startswith(PREFIX):
            raise ConfigurationError(
                f"a webhook secret must be written {PREFIX}<base64> (the Standard Webhooks form)")
        encoded = text[len(PREFIX):]
        try:  # unpadded base64 is common: add the padding b64decode wants
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError(
                f"a webhook secret must be {PREFIX} followed by base64") from None
        if len(key) < 16:
            raise ConfigurationError("a webhook secret must hold at least 16 bytes (24 to 64 "
                                     "recommended)")
        self._key = key

    def __repr__(self) -> str:
        return "WebhookSecret('whsec_…')"

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a WebhookSecret is not pickled")  # keeps the key out of dumps

    def sign(self, msg_id: str, timestamp: int, body: bytes) -> str:
        """``v1,<base64 signature>`` of ``{msg_id}.{timestamp}.{body}``."""
        return "v1," + base64.b64encode(self._digest(msg_id, timestamp, body)).decode()

    def _digest(self, msg_id: str, timestamp: int, body: bytes) -> bytes:
        signed = f"{msg_id}.{timestamp}.".encode() + body
        return hmac.new(self._key, signed, hashlib.sha256).digest()


def generate_secret() -> str:
    """A new random secret (32 bytes) in the ``whsec_`` form."""
    return PREFIX + base64.b64encode(_random.token_bytes(32)).decode()


def secrets_of(given: str | WebhookSecret | Iterable[str | WebhookSecret] | None
               ) -> tuple[WebhookSecret, ...]:
    """Parse one secret or several (rotation: the new one and the ones still accepted)."""
    if given is None:
        return ()
    items = [given] if isinstance(given, (str, WebhookSecret)) else list(given)
    return tuple(s if isinstance(s, WebhookSecret) else WebhookSecret(s) for s in items)


def sign_headers(secrets: Iterable[WebhookSecret], msg_id: str, body: bytes,
                 timestamp: int | None = None) -> dict[str, str]:
    """The three headers of a delivery signed with every one of ``secrets``."""
    when = int(time.time()) if timestamp is None else timestamp
    signatures = " ".join(secret.sign(msg_id, when, body) for secret in secrets)
    return {ID: msg_id, TIMESTAMP: str(when), SIGNATURE: signatures}


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request failed verification: a stable ``code`` and a ``detail`` without secrets."""

    code: str
    detail: str


def verify(secrets: Iterable[WebhookSecret], headers: Mapping[str, bytes], body: bytes, *,
           tolerance: float = DEFAULT_TOLERANCE, now: float | None = None) -> Rejection | None:
    """``None`` if ``body`` with ``headers`` (lower-case names) carries a ``v1`` signature by
    one of ``secrets`` and a timestamp within ``tolerance`` seconds of ``now``; else why not.

    Every candidate is compared in constant time (:func:`hmac.compare_digest`), and all of
    them are compared, so the time taken does not tell which secret or signature came close.
    """
    raw_id, raw_ts, raw_sig = (headers.get(name) for name in (ID, TIMESTAMP, SIGNATURE))
    if not raw_id or not raw_ts or not raw_sig:
        missing = [name for name, value in ((ID, raw_id), (TIMESTAMP, raw_ts),
                                            (SIGNATURE, raw_sig)) if not value]
        return Rejection("missing_signature", "the request is not signed: missing "
                         + ", ".join(missing))
    try:
        msg_id = raw_id.decode()
        timestamp = int(raw_ts) if raw_ts.isdigit() and len(raw_ts) <= 12 else None
    except UnicodeDecodeError:
        return Rejection("invalid_signature", f"{ID} is not UTF-8")
    if timestamp is None:
        return Rejection("malformed_timestamp", f"{TIMESTAMP} must be whole Unix seconds")
    current = time.time() if now is None else now
    if timestamp < current - tolerance:
        return Rejection("stale_timestamp", f"{TIMESTAMP} is more than {tolerance:g}s old")
    if timestamp > current + tolerance:
        return Rejection("future_timestamp",
                         f"{TIMESTAMP} is more than {tolerance:g}s in the future")
    offered = _v1_signatures(raw_sig)
    matched = False
    for secret in secrets:
        expected = secret._digest(msg_id, timestamp, body)
        for candidate in offered:
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        return Rejection("invalid_signature",
                         "no v1 signature matches a secret this receiver accepts")
    return None


def _v1_signatures(header: bytes) -> list[bytes]:
    """The decoded ``v1`` signatures of a ``webhook-signature`` header (others ignored)."""
    found: list[bytes] = []
    for item in header.split(b" ")[:16]:  # bounded: a sender signs with a few secrets at most
        version, _, encoded = item.partition(b",")
        if version != b"v1":
            continue
        try:
            found.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found

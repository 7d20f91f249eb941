"""Webhook signatures: HMAC-SHA256 over '<timestamp>.<body>' (the webhook sender is another issue)."""

from __future__ import annotations

import hashlib
import hmac
import time


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    ts = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def verify(secret: str, body: bytes, header: str, tolerance_s: int = 300, now: int | None = None) -> bool:
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        ts = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((int(time.time()) if now is None else now) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, body, ts), header)

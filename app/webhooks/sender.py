"""One signed POST to a webhook endpoint, to the address the SSRF policy checked.

The connection goes to the checked IP; the Host header and, for https, the TLS SNI and certificate check use the
URL's host name. Redirects are not followed (a 3xx is a failure), proxies from the environment are ignored, and
the response body is never read."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook

from app.webhooks.ssrf import AddressPolicy, RefusedAddress, Resolver, system_resolver

USER_AGENT = "kernel-audit-webhooks/1"


@dataclass(frozen=True)
class AttemptResult:
    status_code: int | None
    latency_ms: float
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status_code is not None and 200 <= self.status_code < 300


def signed_headers(secret: str, event_id: str, body: str, now: datetime | None = None) -> dict[str, str]:
    """Standard Webhooks headers: webhook-id, webhook-timestamp and webhook-signature (v1, HMAC-SHA256)."""
    at = (now or datetime.now(UTC)).replace(microsecond=0)
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(event_id, at, body),
    }


def post(
    url: str,
    body: str,
    headers: dict[str, str],
    *,
    policy: AddressPolicy,
    timeout_s: float,
    resolver: Resolver = system_resolver,
    tls: ssl.SSLContext | None = None,
) -> AttemptResult:
    """`tls`: the certificate check for https (default: the system's CAs), always against the URL's host name."""
    start = time.perf_counter()

    def result(code: int | None, error: str | None) -> AttemptResult:
        return AttemptResult(code, round((time.perf_counter() - start) * 1000, 3), error)

    target = httpx.URL(url)
    try:
        addr = policy.resolve(target.host, target.port or (443 if target.scheme == "https" else 80), resolver)
    except RefusedAddress as err:
        return result(None, f"refused: {err}")
    pinned = target.copy_with(host=str(addr))
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    request_headers = {
        **headers,
        "host": target.netloc.decode("ascii"),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }
    try:
        with httpx.Client(
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(timeout_s),
            verify=tls if tls is not None else True,
        ) as client:
            req = client.build_request(
                "POST", pinned, content=body.encode(), headers=request_headers, extensions=extensions
            )
            resp = client.send(req, stream=True)
            resp.close()  # the status is all we need
    except httpx.TimeoutException as err:
        return result(None, f"timeout after {timeout_s:g} s ({type(err).__name__})")
    except httpx.HTTPError as err:
        return result(None, f"{type(err).__name__}: {err}")
    if resp.is_redirect:
        return result(
            resp.status_code, f"redirect to {resp.headers.get('location', '?')!r} (redirects are not followed)"
        )
    if not 200 <= resp.status_code < 300:
        return result(resp.status_code, f"HTTP {resp.status_code}")
    return result(resp.status_code, None)

"""Webhook signing, SSRF policy, backoff and the sender, against a real HTTP receiver on 127.0.0.1 (no database)."""

from __future__ import annotations

import ipaddress
import json
import random
import ssl
import subprocess
from pathlib import Path

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from webhook_receiver import Receiver

from app.core.settings import Settings
from app.webhooks import sender
from app.webhooks.backoff import retry_delay_s
from app.webhooks.endpoints import new_secret
from app.webhooks.ssrf import AddressPolicy, RefusedAddress

LOOPBACK_ONLY = AddressPolicy.parse("127.0.0.1/32")


def _send(url: str, policy: AddressPolicy, resolver=None, timeout_s: float = 5.0) -> sender.AttemptResult:  # type: ignore[no-untyped-def]
    body = json.dumps({"type": "audit.completed", "data": {"x": 1}})
    headers = sender.signed_headers(new_secret(), "evt_test", body)
    kw = {"resolver": resolver} if resolver else {}
    return sender.post(url, body, headers, policy=policy, timeout_s=timeout_s, **kw)


def test_signature_verifies_with_the_standardwebhooks_package() -> None:
    secret = new_secret()
    body = '{"type":"audit.completed","data":{"verdict":"fail"}}'
    headers = sender.signed_headers(secret, "evt_abc", body)
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert Webhook(secret).verify(body, headers) == json.loads(body)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace("fail", "pass"), headers)  # a forged verdict
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)  # another endpoint's secret
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body, {**headers, "webhook-id": "evt_other"})  # a replay under another id


@pytest.mark.parametrize(
    "addr",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.5.4",
        "192.168.0.10",
        "169.254.169.254",
        "fd00:ec2::254",
        "::1",
        "::ffff:127.0.0.1",
        "fe80::1",
        "224.0.0.1",
        "0.0.0.0",
        "100.64.0.1",
        "240.0.0.1",
        "fc00::5",
    ],
)
def test_policy_refuses_non_public_addresses(addr: str) -> None:
    assert AddressPolicy().check("h", ipaddress.ip_address(addr)) is not None
    with pytest.raises(RefusedAddress, match="may not reach"):
        AddressPolicy().resolve(
            "hooks.example", 443, lambda _h, _p: ["93.184.216.34", addr]
        )  # one bad answer is enough


def test_policy_allows_public_addresses_and_what_the_operator_names() -> None:
    assert AddressPolicy().check("h", ipaddress.ip_address("93.184.216.34")) is None
    assert AddressPolicy().check("h", ipaddress.ip_address("2606:4700::1111")) is None
    policy = AddressPolicy.parse("10.0.0.0/8, hooks.internal")
    assert policy.check("x", ipaddress.ip_address("10.9.9.9")) is None
    assert policy.check("hooks.internal", ipaddress.ip_address("192.168.1.1")) is None
    assert policy.check("x", ipaddress.ip_address("192.168.1.1")) == "private"
    assert policy.check("x", ipaddress.ip_address("169.254.169.254")) == "cloud metadata"
    with pytest.raises(ValueError, match="neither a CIDR nor a host name"):
        AddressPolicy.parse("10.0.0.0/8, bad/entry")
    with pytest.raises(ValueError, match="KAUDIT_WEBHOOK_ALLOWLIST"):
        Settings(webhook_allowlist="10.0.0.0/8, bad/entry")  # refused when the service starts


def test_backoff_grows_with_jitter_and_stays_under_the_cap() -> None:
    rng = random.Random(7)
    delays = [[retry_delay_s(n, 10, 300, rng) for _ in range(200)] for n in range(1, 9)]
    for n, ds in enumerate(delays, start=1):
        ceiling = min(300, 10 * 2 ** (n - 1))
        assert all(ceiling / 2 <= d <= ceiling for d in ds)
        assert max(ds) - min(ds) > ceiling / 4  # jittered, not one fixed delay
    assert [min(ds) for ds in delays[:5]] == sorted(min(ds) for ds in delays[:5])


def test_loopback_receiver_is_refused_without_the_allowlist() -> None:
    with Receiver() as rx:
        result = _send(rx.url, AddressPolicy())
        assert not result.ok and result.error is not None and "loopback" in result.error
        assert rx.requests == []  # nothing was sent


def test_a_host_resolving_to_a_private_address_is_refused_at_connect_time() -> None:
    """The attacker's DNS answers with a private address when the sender connects (a rebinding after registration)."""
    with Receiver() as rx:
        result = _send(
            f"http://hooks.attacker.example:{rx.port}/hook", AddressPolicy(), resolver=lambda _h, _p: ["10.20.30.40"]
        )
        assert not result.ok and result.error is not None and "10.20.30.40 (private)" in result.error
        result = _send(
            f"http://hooks.attacker.example:{rx.port}/hook", AddressPolicy(), resolver=lambda _h, _p: ["127.0.0.1"]
        )
        assert not result.ok and "loopback" in str(result.error)
        assert rx.requests == []


def test_the_connection_goes_to_the_checked_address_with_the_host_name_kept() -> None:
    resolved: list[str] = []

    def once(host: str, _port: int) -> list[str]:
        resolved.append(host)
        return ["127.0.0.1"]

    with Receiver() as rx:
        result = _send(f"http://hooks.example:{rx.port}/hook", LOOPBACK_ONLY, resolver=once)
        assert result.ok, result
        (req,) = rx.received(1)
        assert req.headers["host"] == f"hooks.example:{rx.port}"
        assert resolved == ["hooks.example"]  # resolved once: httpx connected to the address, not the name


def test_a_redirect_is_a_failure_and_is_not_followed() -> None:
    with Receiver() as target, Receiver(script=[("redirect", target.url)]) as rx:
        result = _send(rx.url, LOOPBACK_ONLY)
        assert not result.ok and result.status_code == 302 and "redirect" in str(result.error)
        assert target.requests == []


def test_a_receiver_that_does_not_answer_is_a_timeout() -> None:
    with Receiver(script=["hang"]) as rx:
        result = _send(rx.url, LOOPBACK_ONLY, timeout_s=0.5)
        assert not result.ok and result.status_code is None and "timeout" in str(result.error)
        assert len(rx.requests) == 1


def test_the_documented_receiver_verifies_our_deliveries(capsys: pytest.CaptureFixture[str]) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "webhooks.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    secret = new_secret()
    namespace: dict[str, object] = {}
    exec(compile(code.replace('"whsec_..."', repr(secret)), "docs/webhooks.md", "exec"), namespace)  # our own doc
    handle = namespace["handle"]
    body = json.dumps(
        {
            "type": "audit.completed",
            "timestamp": "2026-12-01T00:00:00+00:00",
            "data": {
                "submission_id": "s1",
                "verdict": "fail",
                "caught_by": "probes",
                "summary": "fail: caught by probes",
            },
        }
    )
    headers = sender.signed_headers(secret, "evt_1", body)
    assert handle(body.encode(), headers) == 204  # type: ignore[operator]
    assert "s1: caught by probes" in capsys.readouterr().out
    assert handle(body.replace("fail", "pass").encode(), headers) == 400  # type: ignore[operator]


def test_https_connects_to_the_checked_address_and_checks_the_certificate_against_the_host_name(tmp_path: Path) -> None:
    """TLS to the pinned IP: SNI and the certificate check use the URL's host name, so pinning weakens nothing."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=hooks.example",
            "-addext",
            "subjectAltName=DNS:hooks.example",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    trust = ssl.create_default_context(cafile=str(cert))
    names: list[str] = []
    server.sni_callback = lambda _sock, name, _ctx: names.append(name)  # type: ignore[assignment, func-returns-value]
    body = '{"type":"audit.completed"}'
    to_loopback = {"resolver": lambda _h, _p: ["127.0.0.1"], "policy": LOOPBACK_ONLY, "timeout_s": 5.0, "tls": trust}
    with Receiver(tls=server) as rx:
        ok = sender.post(f"https://hooks.example:{rx.port}/hook", body, {}, **to_loopback)  # type: ignore[arg-type]
        assert ok.ok, ok
        assert names == ["hooks.example"] and rx.received(1)[0].headers["host"] == f"hooks.example:{rx.port}"
        wrong = sender.post(f"https://other.example:{rx.port}/hook", body, {}, **to_loopback)  # type: ignore[arg-type]
        assert not wrong.ok and "certificate" in str(wrong.error).lower()
        assert len(rx.requests) == 1

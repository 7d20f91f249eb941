"""Which addresses a webhook may reach. The host is resolved once; every address it resolves to must be public
(or named by the operator's allowlist), and the caller connects to the address that was checked, so a DNS answer
that changes between the check and the connection (DNS rebinding) cannot send the request elsewhere."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

CLOUD_METADATA = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})


class RefusedAddress(ValueError):
    """The URL's host is unresolvable, or resolves to an address webhooks may not reach."""


def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for host (a literal IP resolves to itself)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise RefusedAddress(f"{host} does not resolve: {err}") from err
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refusal(addr: IPAddress) -> str | None:
    """Why addr is not a public address (None if it is one)."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    checks = (
        (addr in CLOUD_METADATA, "cloud metadata"),
        (addr.is_loopback, "loopback"),
        (addr.is_link_local, "link-local"),
        (addr.is_multicast, "multicast"),
        (addr.is_unspecified, "unspecified"),
        (addr.is_private, "private"),
        (addr.is_reserved, "reserved"),
        (not addr.is_global, "not globally routable"),
    )
    return next((why for hit, why in checks if hit), None)


@dataclass(frozen=True)
class AddressPolicy:
    """Public addresses, plus what the operator's allowlist names (CIDRs, or host names as written in the URL)."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, allowlist: str) -> AddressPolicy:
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for item in (x.strip() for x in allowlist.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                if not item.replace("-", "").replace(".", "").isalnum():
                    raise ValueError(f"KAUDIT_WEBHOOK_ALLOWLIST: {item!r} is neither a CIDR nor a host name") from None
                hosts.add(item.lower().rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def check(self, host: str, addr: IPAddress) -> str | None:
        """None if a webhook may connect to addr (resolved from host), else why not."""
        if host.lower().rstrip(".") in self.hosts or any(addr in net for net in self.networks):
            return None
        return refusal(addr)

    def resolve(self, host: str, port: int, resolver: Resolver = system_resolver) -> IPAddress:
        """Resolve host once and return the address to connect to; RefusedAddress if any answer is not allowed."""
        answers = resolver(host, port)
        if not answers:
            raise RefusedAddress(f"{host} does not resolve")
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in answers]
        for addr in addresses:
            why = self.check(host, addr)
            if why is not None:
                raise RefusedAddress(
                    f"{host} resolves to {addr} ({why}), which webhooks may not reach "
                    "unless the operator's KAUDIT_WEBHOOK_ALLOWLIST names it"
                )
        return addresses[0]

"""Where the service may send webhooks: public addresses only, unless an admin allows more.

A webhook URL is typed by any admin token's holder, and the service then POSTs to it from inside
the network it runs in. Without a policy a URL such as ``http://169.254.169.254/`` (the cloud
metadata service), ``http://[::ffff:169.254.169.254]/``, ``http://0x7f000001/`` (127.0.0.1 as the
C resolver reads it) or a private address reaches what only the service's host should. So every
address a webhook would connect to must be global (``ipaddress``'s ``is_global``: not loopback,
link-local, private, shared, multicast, reserved or unspecified), with IPv4 embedded in IPv6
(mapped, 6to4, Teredo, NAT64, SIIT, IPv4-compatible) judged as the IPv4 address it carries, unless it lies in a network
listed in ``TURNOUT_WEBHOOK_ALLOW_NETWORKS`` (a receiver inside the cluster, a test's loopback).

The check runs twice: on the URL's host when a webhook is added (an address literal, in any
form the resolver takes, is refused at once), and at each delivery on every address the host
resolves to then, the connection going to the address checked (so a DNS answer that changes
between the check and the connection, "DNS rebinding", reaches nothing the check refused).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Cloud metadata services (AWS, GCP, Azure, OpenStack: 169.254.169.254; AWS over IPv6:
#: fd00:ec2::254), named as such in a refusal.
METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_KINDS = (
    ("is_loopback", "a loopback address"),
    ("is_link_local", "a link-local address"),
    ("is_multicast", "a multicast address"),
    ("is_unspecified", "the unspecified address"),
    ("is_reserved", "a reserved address"),
    ("is_private", "a private address"),
)


class EgressRefused(Exception):
    """A webhook address the egress policy refuses (the message names it and why)."""


@dataclass(frozen=True)
class EgressPolicy:
    """The networks allowed beyond the global addresses (none: public receivers only)."""

    allowed: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, text: str) -> EgressPolicy:
        """A policy from ``TURNOUT_WEBHOOK_ALLOW_NETWORKS``: comma-separated networks or
        addresses (``127.0.0.0/8, 10.1.2.3, fd00::/8``).

        Raises:
            ValueError: an entry is not a network or an address (it is named).
        """
        allowed = []
        for entry in filter(None, (e.strip() for e in text.split(","))):
            try:
                allowed.append(ipaddress.ip_network(entry, strict=False))
            except ValueError as err:
                raise ValueError(f"{entry!r} is not a network or an address ({err})") from None
        return cls(tuple(allowed))

    def refusal(self, address: IPAddress) -> str | None:
        """Why ``address`` may not be sent to, or None when it may."""
        judged = _embedded_ipv4(address) or address
        if any(address in net or judged in net for net in self.allowed):
            return None
        if judged in METADATA or address in METADATA:
            return f"{address} is a cloud metadata address"
        special = isinstance(judged, ipaddress.IPv4Address) and any(
            judged in net for net in _SPECIAL_IPV4
        )
        if special:
            return f"{address} is a special-purpose address"
        if judged.is_global and not judged.is_multicast:  # ipaddress counts 224/4 as global
            return None
        kind = next((word for attr, word in _KINDS if getattr(judged, attr)), "not a public one")
        shown = f"{address} ({judged})" if judged != address else str(address)
        return f"{shown} is {kind}"

    def check_host(self, host: str) -> None:
        """Refuse a URL host that is an address literal the policy refuses, in any form the
        system resolver reads as one (``0x7f000001``, ``2130706433``, ``0177.1``, ``[::1]``);
        a name is checked at delivery, on what it resolves to then.

        Raises:
            EgressRefused: the literal is refused.
        """
        address = literal_address(host)
        if address is not None and (why := self.refusal(address)) is not None:
            raise EgressRefused(_sentence(host, why))

    def resolve(self, host: str, port: int) -> str:
        """The address to connect to for ``host``: every address it resolves to must be
        allowed (one refused address refuses the host: a resolver may answer in any order).

        Raises:
            EgressRefused: an address is refused.
            OSError: the name does not resolve (``socket.gaierror``).
        """
        literal = literal_address(host)
        if literal is not None:
            found: list[IPAddress] = [literal]
        else:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            found = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        for address in found:
            why = self.refusal(address)
            if why is not None:
                raise EgressRefused(_sentence(host, why))
        return str(found[0])


def literal_address(host: str) -> IPAddress | None:
    """``host`` as an address when it is a literal (IPv6 with or without brackets, IPv4 in the
    dotted, hex, octal or integer forms ``inet_aton`` accepts), else None."""
    bare = host.strip("[]")
    try:
        return ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(bare))
    except OSError:
        return None


#: IPv6 prefixes whose last 32 bits are an IPv4 address a gateway may reach: NAT64 (RFC 6052,
#: well-known and local-use), SIIT's ``::ffff:0:0/96`` (RFC 6145) and the deprecated
#: IPv4-compatible ``::/96`` (RFC 4291).
_IPV4_IN_LAST_32 = tuple(
    ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::ffff:0:0:0/96", "::/96")
)
#: IPv4 special-purpose blocks Python's ``is_global`` may call global (192.0.0.0/24: IETF
#: protocol assignments, RFC 6890).
_SPECIAL_IPV4 = (ipaddress.IPv4Network("192.0.0.0/24"),)


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if int(address) > 1 and any(address in net for net in _IPV4_IN_LAST_32):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _sentence(host: str, why: str) -> str:
    return (
        f"the webhook host {host[:200]!r}: {why}; webhooks go to public addresses only "
        "unless TURNOUT_WEBHOOK_ALLOW_NETWORKS lists the network"
    )

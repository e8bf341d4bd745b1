"""Where a webhook may be sent: never to the server's own network unless an
admin allowed it.

A URL's host is resolved, and every address it resolves to must be a public one: loopback,
private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16 with the cloud
metadata service, fe80::/10), CGNAT (100.64/10), unspecified, multicast and reserved
addresses are refused, also when written as decimal (`2130706433`), octal or hex IPv4 or
wrapped in IPv6 (`::ffff:127.0.0.1`, NAT64). `DRAFTYARD_WEBHOOK_ALLOWED_HOSTS` (comma-separated
host names and addresses/CIDRs) lets an admin allow a receiver on the internal network.

The check runs at registration (a 422 naming `url` where it can tell) and again at each
delivery, which then connects to the very address it checked (no second DNS lookup a
rebinding name could answer differently)."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass

from app.core.config import get_settings

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_METADATA = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"))
# What libc's inet_aton reads as an IPv4 address: 1 to 4 parts, each decimal, 0-octal or 0x-hex.
_NUMERIC = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}\.?$", re.I)


class Refused(ValueError):
    """The URL's host is, or resolves to, an address a webhook may not reach."""


def system_resolver(host: str, port: int) -> list[str]:
    return [str(a[4][0]) for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def literal(host: str) -> IP | None:
    """The address `host` names by itself, in any form a resolver would accept, or None."""
    h = host.strip("[]")
    try:
        return ipaddress.ip_address(h.split("%", 1)[0])
    except ValueError:
        pass
    if _NUMERIC.match(h):
        try:
            return ipaddress.ip_address(socket.inet_aton(h.rstrip(".")))
        except OSError:
            raise Refused(f"host {host!r} is not a valid address") from None
    return None


def _unwrap(ip: IP) -> IP:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


def why_internal(ip: IP) -> str | None:
    """A few words on why `ip` is not a public address, or None when it is one."""
    ip = _unwrap(ip)
    checks = ((ip in _METADATA, "the cloud metadata service"),
              (ip.is_loopback, "a loopback address"),
              (ip.is_unspecified, "the unspecified address"),
              (ip.is_link_local, "a link-local address"),
              (ip.version == 4 and ip in _CGNAT, "a carrier-grade NAT (100.64.0.0/10) address"),
              (ip.is_private, "a private address"),
              (ip.is_multicast, "a multicast address"),
              (ip.is_reserved or not ip.is_global, "a reserved address"))
    return next((why for hit, why in checks if hit), None)


@dataclass(frozen=True)
class Allowed:
    """DRAFTYARD_WEBHOOK_ALLOWED_HOSTS, parsed: host names and networks an admin allows."""
    names: frozenset[str]
    nets: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

    @classmethod
    def parse(cls, raw: str) -> "Allowed":
        names, nets = set(), []
        for item in re.split(r"[,\s]+", raw.strip()):
            if not item:
                continue
            try:
                nets.append(ipaddress.ip_network(item.strip("[]"), strict=False))
            except ValueError:
                names.add(item.lower().rstrip("."))
        return cls(frozenset(names), tuple(nets))

    def has(self, ip: IP) -> bool:
        return any(ip in n or _unwrap(ip) in n for n in self.nets)


def allowed() -> Allowed:
    return Allowed.parse(get_settings().webhook_allowed_hosts)


def check_address(host: str, ip: IP, allow: Allowed) -> None:
    if host.lower().rstrip(".") in allow.names or allow.has(ip):
        return
    why = why_internal(ip)
    if why:
        raise Refused(f"host {host!r} is {why if literal(host) else 'resolved to ' + why}; "
                      "webhooks reach public addresses only (an admin may allow internal "
                      "receivers with DRAFTYARD_WEBHOOK_ALLOWED_HOSTS)")


def check_host(host: str, allow: Allowed | None = None) -> None:
    """Registration: what can be told without the network (an address, `localhost`)."""
    allow = allow or allowed()
    h = host.lower().rstrip(".")
    if h in allow.names:
        return
    if h == "localhost" or h.endswith(".localhost"):
        raise Refused(f"host {host!r} is the server itself; webhooks reach public addresses "
                      "only (an admin may allow internal receivers with "
                      "DRAFTYARD_WEBHOOK_ALLOWED_HOSTS)")
    ip = literal(host)
    if ip is not None:
        check_address(host, ip, allow)


def pick(host: str, port: int, resolve: Resolver | None = None,
         allow: Allowed | None = None) -> IP:
    """Delivery: the one address to connect to. Every address the host resolves to must pass
    (a name with one public and one internal address is refused)."""
    allow = allow or allowed()
    ip = literal(host)
    if ip is not None:
        ips = [ip]
    else:
        try:
            ips = [ipaddress.ip_address(a.split("%", 1)[0])
                   for a in (resolve or system_resolver)(host, port)]
        except (OSError, UnicodeError) as e:
            raise LookupError(f"cannot resolve {host!r}: {e}") from None
        if not ips:
            raise LookupError(f"cannot resolve {host!r}")
    for a in ips:
        check_address(host, a, allow)
    return ips[0]

"""What the HTTP front checks before a request reaches a route, against web pages that
drive a daemon through a browser (issue 44, item 7).

* The Host: a page on ``evil.example`` whose name the attacker re-points at 127.0.0.1
  (DNS rebinding) reaches a loopback daemon as its own origin, so the browser lets it
  read the answers; its requests carry ``Host: evil.example``. The front answers a Host
  that is an address it listens on, a loopback name when it listens on loopback (or on
  every address), any IP literal when it listens on every address (an IP literal is no
  rebinding: the page's origin is then that address itself), and the names of
  ``--allowed-hosts`` (``*``: any). A request without a Host (HTTP/1.0) is no browser's.
* The content type: a page may POST ``text/plain`` (or no type at all) anywhere without
  asking first (a CORS "simple request"); a JSON type makes the browser ask (a preflight,
  which the front does not grant), so a body whose type is not JSON is refused.
* The bearer token: the scheme is case-insensitive (RFC 7235), as the dashboard takes it.

Interface: ``HostRule`` (``allows(host_header)``, ``describe()``), ``host_name``,
``parse_allowed_hosts``, ``is_json_type``, ``bearer_matches``.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable

_LOOPBACK_NAMES = frozenset({"localhost"})
_LOOPBACK_IPS = frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def host_name(value: str) -> str:
    """The name of a Host header or an --allowed-hosts entry: lower case, without the port,
    the IPv6 brackets or a final dot."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        return v[1:end] if end > 0 else v
    if _ip(v) is None:  # an IPv6 address without brackets has colons of its own
        name, sep, port = v.rpartition(":")
        if sep and (port.isdigit() or not port):
            v = name
    return v.rstrip(".")


def _ip(name: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def parse_allowed_hosts(spec: str | Iterable[str] | None) -> list[str]:
    """``--allowed-hosts NAME[,NAME]`` (repeatable) as a list of names; ``*`` kept as is."""
    if spec is None:
        return []
    parts = [spec] if isinstance(spec, str) else list(spec)
    names = [host_name(n) if n.strip() != "*" else "*"
             for part in parts for n in part.split(",") if n.strip()]
    return [n for n in names if n]


class HostRule:
    """Which Host headers a front bound to ``bind_host`` (resolved to ``bound_ip``)
    answers."""

    def __init__(self, bind_host: str, bound_ip: str, allowed: Iterable[str] = ()) -> None:
        names = list(allowed)
        self.any = "*" in names
        self.configured = [n for n in names if n != "*"]
        self.names = {host_name(n) for n in self.configured}
        self.ips: set[IpAddress] = set()
        self.bound = bound_ip
        for n in (bind_host, bound_ip):
            ip = _ip(host_name(n))
            if ip is None:
                self.names.add(host_name(n))  # --http myhost:8080: its own name
            else:
                self.ips.add(ip)
        self.ips |= {ip for n in self.names if (ip := _ip(n)) is not None}
        self.every_address = any(ip.is_unspecified for ip in self.ips)
        if self.every_address or any(ip.is_loopback for ip in self.ips) \
                or host_name(bind_host) in _LOOPBACK_NAMES:
            self.names |= _LOOPBACK_NAMES
            self.ips |= _LOOPBACK_IPS

    def allows(self, host: str | None) -> bool:
        if self.any or host is None:
            return True
        name = host_name(host)
        if name in self.names:
            return True
        ip = _ip(name)
        return ip is not None and (self.every_address or ip in self.ips)

    def describe(self, host: str) -> str:
        """Why ``host`` is refused, and how to allow it."""
        return (f"the Host {host_name(host)!r} is not a name of this server (it listens "
                f"on {self.bound}); a web page under another name may not drive it "
                f"(DNS rebinding). To serve it under that name, start the daemon with "
                f"--allowed-hosts {host_name(host)} ('*' allows any)")


def is_json_type(content_type: str | None) -> bool:
    """``application/json``, or any ``type/subtype+json``, parameters aside."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    kind, sep, subtype = media.partition("/")
    return bool(kind and sep) and (media == "application/json" or subtype.endswith("+json"))


def bearer_matches(header: str | bytes | None, token: bytes) -> bool:
    """Whether an ``Authorization`` value is ``Bearer <token>``, the scheme in any case."""
    if not header:
        return False
    raw = header.encode("latin-1", "replace") if isinstance(header, str) else header
    scheme, _, value = raw.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), token)

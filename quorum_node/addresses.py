"""A host and a port as text, and the listening socket of "every interface".

An IPv6 literal is bracketed wherever a port follows it (``[fd00::5]:9093``, in URLs as in
``host:port`` and ``id@host:port``; RFC 3986): its colons would otherwise be read as the
port's. Every place that joins a host and a port goes through ``host_port``.
"""

from __future__ import annotations

import socket


def url_host(host: str) -> str:
    """``host`` as it stands before ``:port``: an IPv6 literal in brackets (once)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def host_port(host: str, port: int) -> str:
    return f"{url_host(host)}:{port}"


def address_url(scheme: str, host: str, port: int, path: str = "") -> str:
    return f"{scheme}://{host_port(host, port)}{path}"


def every_interface_socket(port: int, *, backlog: int) -> socket.socket:
    """A listening socket on every interface: one dual-stack IPv6 socket (IPV6_V6ONLY off, so
    IPv4 clients reach it as ::ffff:a.b.c.d) where the host supports IPv6, else 0.0.0.0. One
    socket rather than one per family: a single-stack cluster, IPv4 or IPv6, is served alike,
    and the port is taken once."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("::", port), family=socket.AF_INET6, backlog=backlog,
                                    dualstack_ipv6=True)
    return socket.create_server(("0.0.0.0", port), backlog=backlog)

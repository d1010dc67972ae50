"""The HTTP server's connection limits whose defaults ``ki collector --help`` prints, defined once here.

Standard library only: api/connections.py, which applies them, imports uvicorn and h11, which
the help text has no use for. Both import the values from here.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_KEEP_ALIVE_S",
    "DEFAULT_MAX_CONNECTIONS",
]

#: Most connections open at once (lowered to fit the process's descriptor limit).
DEFAULT_MAX_CONNECTIONS = 4096
#: Seconds a client has to send a whole request head.
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: Seconds a client has to send a whole request body once its head arrived (16 MiB at 300 kB/s).
DEFAULT_BODY_TIMEOUT_S = 60.0
#: Seconds an idle keep-alive connection stays open between requests: longer than the
#: intervals clients send at (scrapes, remote_write, rule evaluation, agents: 10 s to 1 min), as
#: Prometheus' own server keeps them (its ``--web.read-timeout``, 5 min); past the cap the one
#: idle longest is closed first, so a long wait costs no more than a descriptor.
DEFAULT_KEEP_ALIVE_S = 300.0

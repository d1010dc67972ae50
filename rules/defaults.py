"""The rule manager's tunables whose defaults ``ki collector --help`` prints, defined once here.

Standard library only: the manager imports the engine, the notifier and httpx, which the help
text has no use for. The manager and the command line both import the values from here.
"""

from __future__ import annotations

__all__ = ["DEFAULT_RESEND_DELAY_MS"]

#: A firing alert is sent again this often (Prometheus' ``--rules.alert.resend-delay``).
DEFAULT_RESEND_DELAY_MS = 60_000

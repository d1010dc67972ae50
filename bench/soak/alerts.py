"""The soak's alerting: a real Alertmanager, the soak's own rule, and whether its alert kept time.

The collector evaluates the shipped rules (deploy/rules/*.yml) and :data:`RULE` with
``--rules`` and sends alerts to a ``prometheus-alertmanager`` (Debian's) on 127.0.0.1 with its
own data directory. The soak sets :data:`GAUGE` above :data:`THRESHOLD` in its remote_write
stream for a while (:class:`Condition`), and :class:`AlertWatch` reads Alertmanager's
``/api/v2/alerts`` to see when each alert arrived there and when it left (resolved).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from kernel_insight.run import free_port

__all__ = ["ALERT", "GAUGE", "RULE", "AlertWatch", "Alertmanager", "Condition", "RuleHealth"]

GAUGE, THRESHOLD, ALERT = "soak_alert_gauge", 50.0, "SoakGaugeHigh"
#: The soak rule's evaluation interval and ``for`` (seconds).
EVAL_S, FOR_S = 5.0, 10.0
RULE = f"""groups:
  - name: soak
    interval: {EVAL_S:g}s
    rules:
      - alert: {ALERT}
        expr: {GAUGE} > {THRESHOLD:g}
        for: {FOR_S:g}s
        labels:
          severity: none
"""
#: Slack on top of the rule's own bound: the collector's send, Alertmanager, the watch's poll.
SLACK_S = 10.0


class Alertmanager:
    """``prometheus-alertmanager`` on 127.0.0.1, its data and log under ``root``; None of it when
    the binary is missing (then alerts are evaluated and not delivered, and the check says so)."""

    BINARY = shutil.which("prometheus-alertmanager")

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "am.yml").write_text(
            "route: {receiver: soak, group_by: [alertname], group_wait: 1s, group_interval: 1s, repeat_interval: 1h}\n"
            "receivers: [{name: soak}]\n"
        )
        assert self.BINARY is not None
        with (root / "alertmanager.log").open("w") as log:
            self.proc = subprocess.Popen(
                [self.BINARY, f"--config.file={root / 'am.yml'}", f"--storage.path={root / 'am'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"alertmanager not ready: {(root / 'alertmanager.log').read_text()[-1000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Condition:
    """When the soak's gauge is high: from ``on_at`` for ``hold_s`` (monotonic seconds); the times
    the first high and the first low-again sample were acknowledged are noted by the sender."""

    def __init__(self, on_at: float, hold_s: float) -> None:
        self.on_at, self.off_at = on_at, on_at + hold_s
        self.began: float | None = None  # the first high sample acknowledged
        self.ended: float | None = None  # the first low sample acknowledged after it

    def value(self, now: float) -> float:
        return 2 * THRESHOLD if self.on_at <= now < self.off_at else 0.0

    def acked(self, value: float, at: float) -> None:
        if value > THRESHOLD and self.began is None:
            self.began = at
        elif value <= THRESHOLD and self.began is not None and self.ended is None:
            self.ended = at


class AlertWatch:
    """Polls Alertmanager's active alerts every ``every_s``: each alert name's first arrival and,
    per arrival, when it was last seen and first seen gone (resolved)."""

    def __init__(self, url: str, every_s: float = 2.0) -> None:
        self.url, self.every_s = url, every_s
        #: alertname -> [(arrived, gone or None)]: one entry per firing spell
        self.spells: dict[str, list[list[float | None]]] = {}
        self.errors = 0
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.poll()

    def poll(self) -> None:
        try:
            alerts = httpx.get(f"{self.url}/api/v2/alerts", timeout=10).json()
        except (httpx.HTTPError, ValueError):
            self.errors += 1
            return
        now = time.monotonic()
        active = {
            a["labels"].get("alertname", "") for a in alerts if a.get("status", {}).get("state") == "active"
        }
        for name in active:
            spells = self.spells.setdefault(name, [])
            if not spells or spells[-1][1] is not None:
                spells.append([now, None])
        for name, spells in self.spells.items():
            if name not in active and spells[-1][1] is None:
                spells[-1][1] = now

    def close(self) -> None:
        self.stop.set()
        self._thread.join(30)

    def judge(self, cond: Condition, faults: list[tuple[str, float, float]]) -> tuple[bool, str]:
        """Whether the soak's alert fired within ``for`` + two evaluations (+ slack) of the
        condition's beginning and resolved within two evaluations (+ slack) of its end; lateness
        while a fault (name, begin, end) overlapped that bound is the fault's, and said so."""
        if cond.began is None or cond.ended is None:
            return False, "the condition never began and ended (remote_write failed throughout)"
        spells = [s for s in self.spells.get(ALERT, []) if s[0] is not None and s[0] >= cond.began]

        def excuse(lo: float, hi: float) -> str:
            return ", ".join(sorted({name for name, b, e in faults if b <= hi and e >= lo}))

        notes: list[str] = []
        ok = True

        def timed(what: str, since: float, at: float, bound: float) -> None:
            """Note ``what`` happened ``at``, ``since`` the condition turned; late past ``bound``
            is a failure unless a fault overlapped the lateness."""
            nonlocal ok
            notes.append(
                f"{what} {at - since:.1f} s after the condition turned (bound {bound - since:.0f} s)"
            )
            if at > bound:
                why = excuse(since, at)
                notes.append(f"late: {'during ' + why if why else 'no fault explains it'}")
                ok = ok and bool(why)

        if not spells:
            return False, f"{ALERT} never reached Alertmanager"
        fired, gone = spells[0][0], spells[-1][1]
        assert fired is not None
        timed("fired", cond.began, fired, cond.began + FOR_S + 2 * EVAL_S + SLACK_S)
        if gone is None:
            return False, "; ".join([*notes, "never resolved"])
        timed("resolved", cond.ended, gone, cond.ended + 2 * EVAL_S + SLACK_S)
        if len(spells) > 1:
            whys = [
                excuse(a[1], b[0])
                for a, b in itertools.pairwise(spells)
                if a[1] is not None and b[0] is not None
            ]
            notes.append(f"{len(spells)} spells (faults between: {'; '.join(w or 'none' for w in whys)})")
            ok = ok and all(whys)
        return ok, "; ".join(notes)


class RuleHealth:
    """The collector's rules as ``/api/v1/rules`` shows them over the run: which were ever
    evaluated and healthy, and which ever failed (with the error). A restarted collector shows a
    group unevaluated until its first slot, so one look at the end would not do.

    A failure is the rule's evaluation, not the look that saw it: a rule's ``lastError`` stays
    until its group's next evaluation (up to its interval later), so each failed evaluation
    (``lastEvaluation``) is kept once, with the span between the look before and the look that
    first showed it: it happened then, and a fault that overlaps that span explains it."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.evaluated: set[str] = set()
        #: (name, its error, the span it happened in: monotonic, from the look before to this one)
        self.failed: list[tuple[str, str, float, float]] = []
        self._failures_seen: set[tuple[str, str]] = set()  # (name, lastEvaluation)
        self._last_look: float | None = None

    def poll(self, client: httpx.Client) -> None:
        r = client.get("/api/v1/rules")
        r.raise_for_status()
        now = time.monotonic()
        since = now if self._last_look is None else self._last_look
        self._last_look = now
        for g in r.json()["data"]["groups"]:
            for rule in g["rules"]:
                name = f"{g['name']}/{rule['name']}"
                self.names.add(name)
                evaluated = str(rule.get("lastEvaluation", "0001-"))
                if evaluated.startswith("0001-"):
                    continue
                if rule.get("health") == "ok":
                    self.evaluated.add(name)
                elif (name, evaluated) not in self._failures_seen:
                    self._failures_seen.add((name, evaluated))
                    self.failed.append((name, str(rule.get("lastError", rule.get("health"))), since, now))

    def problems(self, during_fault: Callable[[float, float], bool], every_rule: bool = True) -> list[str]:
        """Rules never evaluated (with ``every_rule``: a run of a few minutes with collector
        restarts can end before a 1-minute group's first slot), and rules that failed while no
        fault ran (``during_fault(a, b)``: whether a fault overlapped the span ``a``-``b`` the
        failed evaluation happened in)."""
        never = sorted(self.names - self.evaluated) if every_rule else []
        return [f"{n}: never evaluated" for n in never] + [
            f"{n}: {e}" for n, e in sorted({(n, e) for n, e, a, b in self.failed if not during_fault(a, b)})
        ]

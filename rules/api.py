"""``/api/v1/rules``, ``/api/v1/alerts`` (Prometheus' JSON, which Grafana's alert list reads) and ``POST /-/reload``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from kernel_insight.api.auth import Authenticator, Scope
from kernel_insight.api.errors import error_response
from kernel_insight.kql.printer import format_expr
from kernel_insight.rules.evaluation import Alert, AlertingRule, AlertState, Group
from kernel_insight.rules.manager import RuleManager
from kernel_insight.rules.notifier import rfc3339

__all__ = ["alert_json", "rules_json", "rules_router"]

_ZERO_TIME = "0001-01-01T00:00:00Z"


def _time(ms: int) -> str:
    return rfc3339(ms) if ms else _ZERO_TIME


def _value(v: float) -> str:
    """``strconv.FormatFloat(v, 'e', -1, 64)``: ``1e+00``, ``2.5e-01``."""
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    mant, _, exp = f"{v:.17e}".partition("e")
    # the shortest mantissa that reads back as v
    for digits in range(17):
        text = f"{v:.{digits}e}"
        if float(text) == v:
            mant, _, exp = text.partition("e")
            break
    sign = exp[0]
    return f"{mant}e{sign}{exp[1:].lstrip('0').rjust(2, '0')}"


def alert_json(a: Alert) -> dict[str, Any]:
    out: dict[str, Any] = {
        "labels": dict(a.labels),
        "annotations": dict(a.annotations),
        "state": a.state.value,
        "activeAt": _time(a.active_at_ms),
        "value": _value(a.value),
    }
    if a.keep_firing_since_ms:
        out["keepFiringSince"] = _time(a.keep_firing_since_ms)
    return out


def _query_text(rule: Any) -> str:
    try:
        return format_expr(rule.spec.query)
    except Exception:  # the printer is total on parsed queries; the text is the fallback
        return str(rule.spec.expr).strip()


def rules_json(
    groups: list[Group],
    *,
    kind: str = "",
    names: set[str] | None = None,
    group_names: set[str] | None = None,
    files: set[str] | None = None,
    exclude_alerts: bool = False,
) -> dict[str, Any]:
    """The ``data`` of ``/api/v1/rules`` with Prometheus' filters (``type``, ``rule_name[]``, ...)."""
    out = []
    for g in groups:
        if (group_names and g.spec.name not in group_names) or (files and g.spec.file not in files):
            continue
        rules: list[dict[str, Any]] = []
        for r in g.rules:
            if names and r.name not in names:
                continue
            common = {"health": r.health}
            if r.last_error:
                common["lastError"] = r.last_error
            if isinstance(r, AlertingRule):
                if kind == "record":
                    continue
                active = [a for a in r.active.values() if a.state != AlertState.INACTIVE]
                rules.append(
                    {
                        "state": r.state.value,
                        "name": r.name,
                        "query": _query_text(r),
                        "duration": r.spec.for_ms / 1000,
                        "keepFiringFor": r.spec.keep_firing_for_ms / 1000,
                        "labels": dict(r.labels),
                        "annotations": dict(r.spec.annotations),
                        "alerts": None if exclude_alerts else [alert_json(a) for a in active],
                        **common,
                        "evaluationTime": r.eval_seconds,
                        "lastEvaluation": _time(r.last_eval_ms),
                        "type": "alerting",
                    }
                )
            else:
                if kind == "alert":
                    continue
                rules.append(
                    {
                        "name": r.name,
                        "query": _query_text(r),
                        "labels": dict(r.labels),
                        **common,
                        "evaluationTime": r.eval_seconds,
                        "lastEvaluation": _time(r.last_eval_ms),
                        "type": "recording",
                    }
                )
        if rules:
            out.append(
                {
                    "name": g.spec.name,
                    "file": g.spec.file,
                    "rules": rules,
                    "interval": g.spec.interval_ms / 1000,
                    "limit": g.spec.limit,
                    "evaluationTime": g.eval_seconds,
                    "lastEvaluation": _time(g.last_eval_ms),
                }
            )
    return {"groups": out}


def rules_router(
    manager: Callable[[], RuleManager | None], auth: Authenticator, *, manage_lifecycle: bool = False
) -> APIRouter:
    """The rule endpoints over whatever manager ``manager()`` returns (None: no rules loaded);
    with ``manage_lifecycle`` the app's lifespan starts and stops the manager."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        m = manager()
        if m is not None:
            m.start()
        try:
            yield
        finally:
            if m is not None:
                await run_in_threadpool(m.shutdown)

    router = APIRouter(tags=["rules"], lifespan=lifespan if manage_lifecycle else None)
    read = Depends(auth.require(Scope.READ))
    admin = Depends(auth.require(Scope.ADMIN))

    def _groups() -> list[Group]:
        m = manager()
        return [] if m is None else m.groups

    @router.get("/api/v1/rules", summary="Alerting and recording rules with their state (Prometheus API)")
    async def rules(request: Request, _t: object = read) -> JSONResponse:
        q = request.query_params
        kind = q.get("type", "").lower()
        if kind not in ("", "alert", "record"):
            return error_response(400, "bad_data", f'invalid parameter "type": not supported value "{kind}"')
        exclude = q.get("exclude_alerts", "").lower()
        if exclude not in ("", "true", "false"):
            return error_response(
                400, "bad_data", f'invalid parameter "exclude_alerts": strconv.ParseBool: parsing "{exclude}"'
            )
        data = rules_json(
            _groups(),
            kind=kind,
            names=set(q.getlist("rule_name[]")),
            group_names=set(q.getlist("rule_group[]")),
            files=set(q.getlist("file[]")),
            exclude_alerts=exclude == "true",
        )
        return JSONResponse({"status": "success", "data": data})

    @router.get("/api/v1/alerts", summary="Active alerts (Prometheus API)")
    async def alerts(_t: object = read) -> JSONResponse:
        out = [
            alert_json(a)
            for g in _groups()
            for r in g.rules
            if isinstance(r, AlertingRule)
            for a in r.active.values()
            if a.state != AlertState.INACTIVE
        ]
        return JSONResponse({"status": "success", "data": {"alerts": out}})

    @router.post("/-/reload", summary="Read the rule files again (scope admin)")
    async def reload(_t: object = admin) -> JSONResponse:
        m = manager()
        if m is None:
            return error_response(400, "bad_data", "no rule files: start the collector with --rules")
        status = await run_in_threadpool(m.reload)
        if status.error:
            return error_response(400, "bad_data", f"error reloading rules: {status.error}")
        return JSONResponse(
            {"status": "success", "data": {"files": list(status.files), "groups": len(m.groups)}}
        )

    return router

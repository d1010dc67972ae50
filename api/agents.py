"""``/v1/agents``: agent enrolment over HTTP, the same acts as ``ki keys`` (scope ``ingest-admin``).

A key leaves the collector once, in the body of the answer that created it (marked
``Cache-Control: no-store``); listings and errors name agent and key ids only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from kernel_insight.api.auth import Authenticator, Scope
from kernel_insight.api.errors import ApiError
from kernel_insight.collector.keys import (
    AgentCredentials,
    AgentInfo,
    KeyStoreBase,
    KeyStoreError,
    RevokedAgent,
    UnknownAgent,
    check_agent_name,
    check_instance_labels,
    parse_agent_id,
)

__all__ = ["AgentList", "AgentRecord", "EnrolRequest", "IssuedKey", "agents_router"]

log = logging.getLogger("kernel_insight.api.agents")
T = TypeVar("T")

#: Bodies of enrolment requests are a short name and a few labels; anything larger is refused before parsing.
_MAX_BODY = 8192
_NO_STORE = {"Cache-Control": "no-store"}


class EnrolRequest(BaseModel):
    name: str = Field(description="a label for people, e.g. host-17/gpu0 (1-200 characters, one line)")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="the instance's labels (model, host, rack, switch, ...), applied to it and its series",
    )


class AgentRecord(BaseModel):
    agent_id: str = Field(description="32 hex digits; public (it travels in every batch header)")
    name: str
    created: float = Field(description="Unix seconds")
    revoked: bool
    active_key_ids: list[int]
    retired_key_ids: list[int]
    labels: dict[str, str]


class AgentList(BaseModel):
    agents: list[AgentRecord]


class IssuedKey(BaseModel):
    agent: AgentRecord
    key_id: int
    key_file: str = Field(description="the agent's key file (docs/agent.md); shown once, save it mode 0600")


def _record(info: AgentInfo) -> dict[str, Any]:
    return {
        "agent_id": info.agent_id,
        "name": info.name,
        "created": info.created,
        "revoked": info.revoked,
        "active_key_ids": list(info.active_key_ids),
        "retired_key_ids": list(info.retired_key_ids),
        "labels": dict(info.labels),
    }


def _agent_id(text: str) -> bytes:
    try:
        return parse_agent_id(text)
    except KeyStoreError as exc:
        raise ApiError(400, "bad_data", str(exc)) from None


def _key_id(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 1 << 31:
        raise ApiError(400, "bad_data", f"invalid key id {text[:40]!r}: expected a positive integer")
    return int(text)


async def _call(fn: Callable[[], T]) -> T:
    """Run a key store act off the event loop, its exceptions turned into answers (never a 500)."""
    try:
        return await run_in_threadpool(fn)
    except UnknownAgent as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    except RevokedAgent as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    except (KeyStoreError, OSError) as exc:  # the collector's own store is broken: retry later
        log.error("agents: key store unusable: %s", exc)
        raise ApiError(503, "unavailable", f"key store unavailable: {exc}", {"Retry-After": "5"}) from None


def _issued(keys: KeyStoreBase, creds: AgentCredentials, status: int) -> JSONResponse:
    info = keys.agent(creds.agent_id)
    body = {"agent": _record(info), "key_id": creds.key_id, "key_file": creds.key_file_text()}
    return JSONResponse(body, status_code=status, headers=_NO_STORE)


async def _enrol_body(request: Request) -> tuple[str, dict[str, str]]:
    """The ``name`` and ``labels`` of a JSON body, parsed here so that every bad body is a 400 with a message."""
    raw = bytearray()
    async for chunk in request.stream():  # refused as soon as it is too long, never buffered whole
        raw += chunk
        if len(raw) > _MAX_BODY:
            raise ApiError(413, "bad_data", f"request body larger than {_MAX_BODY} bytes")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ApiError(400, "bad_data", 'the body must be JSON: {"name": "..."}') from None
    name = doc.get("name") if isinstance(doc, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, "bad_data", 'the body must be {"name": "<label>"} with a string name')
    try:
        check_agent_name(name)
        labels = check_instance_labels(doc.get("labels") or {})
    except KeyStoreError as exc:
        raise ApiError(400, "bad_data", str(exc)) from None
    return name, labels


_AGENT_ID = Path(description="the agent id (32 hex digits, dashes allowed)")
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "Malformed agent id, key id or body"},
    401: {"description": "Missing or unknown bearer token"},
    403: {"description": "The token lacks the ingest-admin scope"},
    404: {"description": "No such agent or key"},
    503: {"description": "The key store cannot be read or written now"},
}


def agents_router(keys: KeyStoreBase, auth: Authenticator) -> APIRouter:
    """Enrol, list, rotate, retire and revoke agents in ``keys`` (the collector's key store)."""
    router = APIRouter(tags=["agents"], dependencies=[Depends(auth.require(Scope.INGEST_ADMIN))])

    @router.get("/v1/agents", response_model=AgentList, responses=_ERRORS, summary="Every agent (no keys)")
    async def list_agents() -> JSONResponse:
        infos = await _call(keys.agents)
        return JSONResponse({"agents": [_record(i) for i in infos]})

    @router.get(
        "/v1/agents/{agent_id}", response_model=AgentRecord, responses=_ERRORS, summary="One agent (no keys)"
    )
    async def get_agent(agent_id: str = _AGENT_ID) -> JSONResponse:
        aid = _agent_id(agent_id)
        return JSONResponse(_record(await _call(lambda: keys.agent(aid))))

    @router.post(
        "/v1/agents",
        status_code=201,
        response_model=IssuedKey,
        responses=_ERRORS,
        summary="Enrol an agent; the answer holds its key file, once",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": EnrolRequest.model_json_schema()}},
            }
        },
    )
    async def enrol(request: Request) -> JSONResponse:
        name, labels = await _enrol_body(request)
        creds = await _call(lambda: keys.add_agent(name, labels))
        log.info("agents: enrolled agent %s", creds.agent_id.hex())
        return await _call(lambda: _issued(keys, creds, 201))

    @router.post(
        "/v1/agents/{agent_id}/rotate",
        status_code=201,
        response_model=IssuedKey,
        responses={**_ERRORS, 409: {"description": "The agent was revoked"}},
        summary="A new key for the agent (the two newest stay active); the answer holds it, once",
    )
    async def rotate(agent_id: str = _AGENT_ID) -> JSONResponse:
        aid = _agent_id(agent_id)
        creds = await _call(lambda: keys.rotate(aid))
        log.info("agents: agent %s has new key %d", aid.hex(), creds.key_id)
        return await _call(lambda: _issued(keys, creds, 201))

    @router.post(
        "/v1/agents/{agent_id}/keys/{key_id}/retire",
        response_model=AgentRecord,
        responses=_ERRORS,
        summary="Deactivate one of the agent's keys",
    )
    async def retire(agent_id: str = _AGENT_ID, key_id: str = Path(description="the key id")) -> JSONResponse:
        aid, kid = _agent_id(agent_id), _key_id(key_id)
        await _call(lambda: keys.retire(aid, kid))
        log.info("agents: agent %s key %d retired", aid.hex(), kid)
        return JSONResponse(_record(await _call(lambda: keys.agent(aid))))

    @router.post(
        "/v1/agents/{agent_id}/revoke",
        response_model=AgentRecord,
        responses=_ERRORS,
        summary="Refuse everything from the agent from now on",
    )
    async def revoke(agent_id: str = _AGENT_ID) -> JSONResponse:
        aid = _agent_id(agent_id)
        await _call(lambda: keys.revoke(aid))
        log.info("agents: agent %s revoked", aid.hex())
        return JSONResponse(_record(await _call(lambda: keys.agent(aid))))

    return router

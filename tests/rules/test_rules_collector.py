"""Rules evaluated inside the collector: state written back, the Prometheus rules/alerts API,
notifications to an Alertmanager-shaped receiver, restore after a restart, reload."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from rules_helpers import receiver

from kernel_insight.api import TokenStore
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.kql import Engine
from kernel_insight.rules.manager import RuleManager
from kernel_insight.rules.notifier import Notifier
from kernel_insight.server import build_collector_app

T0 = 1_800_000_000_000  # a fixed time (2027-01-15) so the test does not depend on the clock
RULES = """
groups:
  - name: gpu
    interval: 15s
    rules:
      - record: {metric}:max
        expr: max by (instance) ({metric})
      - alert: GpuHot
        expr: {metric}:max > 85
        for: 30s
        labels:
          severity: page
        annotations:
          summary: '{{{{ $labels.instance }}}} at {{{{ $value }}}} C'
"""


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "store")
    yield s
    s.close()


def _write(store, metric, instance, t0, values, step=15_000):
    b = SampleBuilder()
    b.add_series(
        {"__name__": metric, "instance": instance, "gpu": "0"},
        [t0 + i * step for i in range(len(values))],
        values,
    )
    store.insert_samples(b.build())


def _client_get(app, path, **kw):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ki") as c:
            return await c.request(kw.pop("method", "GET"), path, **kw)

    return asyncio.run(go())


def _manager(store, path, url=None, **kw):
    m = RuleManager(
        store, [str(path)], notifier=Notifier([url] if url else []), external_url="http://ki.test:8470", **kw
    )
    m.load()
    return m


def test_alerts_go_pending_then_firing_are_written_back_and_sent(store, tmp_path):
    metric = "t1_gpu_temp_celsius"
    (tmp_path / "r.yml").write_text(RULES.format(metric=metric))
    _write(store, metric, "h1", T0, [90.0] * 12)
    _write(store, metric, "h2", T0, [40.0] * 12)
    with receiver() as rec:
        m = _manager(store, tmp_path / "r.yml", rec.url)
        m.notifier.start()
        (key,) = list(m.runners)
        for i in range(4):
            m.tick(key, T0 + 15_000 + i * 15_000)
        engine = Engine(store.storage())
        alerts = engine.instant_query('ALERTS{alertname="GpuHot"}', T0 + 60_000).value.samples
        assert [(dict(s.labels)["instance"], dict(s.labels)["alertstate"]) for s in alerts] == [
            ("h1", "firing")
        ]
        for_state = engine.instant_query("ALERTS_FOR_STATE", T0 + 60_000).value.samples
        assert [s.value for s in for_state] == [(T0 + 15_000) // 1000]
        recorded = engine.instant_query(f"{metric}:max", T0 + 60_000).value.samples
        assert sorted(dict(s.labels)["instance"] for s in recorded) == ["h1", "h2"]
        (batch,) = rec.wait_for(lambda: rec.bodies("/api/v2/alerts"), 10)
        (sent,) = batch
        assert sent["labels"] == {"alertname": "GpuHot", "instance": "h1", "severity": "page"}
        assert sent["annotations"] == {"summary": "h1 at 90 C"}
        assert sent["startsAt"] == "2027-01-15T08:00:45Z"  # fired at the third slot: 30 s after active
        assert sent["generatorURL"].startswith(
            "http://ki.test:8470/api/v1/query?query=t1_gpu_temp_celsius%3Amax"
        )
        m.notifier.shutdown()


def test_the_rules_and_alerts_api_answer_in_prometheus_shape(store, tmp_path):
    metric = "t2_gpu_temp_celsius"
    (tmp_path / "r.yml").write_text(RULES.format(metric=metric))
    _write(store, metric, "h1", T0, [90.0] * 8)
    m = _manager(store, tmp_path / "r.yml")
    (key,) = list(m.runners)
    m.tick(key, T0 + 15_000)
    app = build_collector_app(store, local_dev=True, keys_path=tmp_path / "k.json", rules=m)
    body = _client_get(app, "/api/v1/rules").json()
    assert body["status"] == "success"
    (group,) = body["data"]["groups"]
    assert set(group) == {"name", "file", "rules", "interval", "limit", "evaluationTime", "lastEvaluation"}
    assert (group["name"], group["interval"], group["lastEvaluation"]) == (
        "gpu",
        15.0,
        "2027-01-15T08:00:15Z",
    )
    rec_rule, alert_rule = group["rules"]
    assert set(rec_rule) == {"name", "query", "labels", "health", "evaluationTime", "lastEvaluation", "type"}
    assert (rec_rule["type"], rec_rule["health"], rec_rule["query"]) == (
        "recording",
        "ok",
        f"max by (instance) ({metric})",
    )
    assert alert_rule["type"] == "alerting"
    assert (alert_rule["state"], alert_rule["duration"], alert_rule["keepFiringFor"]) == (
        "pending",
        30.0,
        0.0,
    )
    assert alert_rule["labels"] == {"severity": "page"}
    (a,) = alert_rule["alerts"]
    assert a == {
        "labels": {"alertname": "GpuHot", "instance": "h1", "severity": "page"},
        "annotations": {"summary": "h1 at 90 C"},
        "state": "pending",
        "activeAt": "2027-01-15T08:00:15Z",
        "value": "9e+01",
    }
    assert _client_get(app, "/api/v1/alerts").json()["data"]["alerts"] == [a]
    only_rec = _client_get(app, "/api/v1/rules?type=record").json()["data"]["groups"][0]["rules"]
    assert [r["type"] for r in only_rec] == ["recording"]
    assert _client_get(app, "/api/v1/rules?rule_name[]=nope").json()["data"]["groups"] == []
    bad = _client_get(app, "/api/v1/rules?type=x")
    assert bad.status_code == 400
    assert bad.json()["errorType"] == "bad_data"


def test_an_evaluation_error_shows_as_health_err_with_the_message(store, tmp_path):
    (tmp_path / "r.yml").write_text(
        "groups: [{name: e, rules: [{alert: Dup, expr: 't3_x', labels: {instance: same}}]}]\n"
    )
    b = SampleBuilder()
    for inst in ("a", "b"):
        b.add({"__name__": "t3_x", "instance": inst}, T0, 1.0)
    store.insert_samples(b.build())
    m = _manager(store, tmp_path / "r.yml")
    m.tick(next(iter(m.runners)), T0)
    app = build_collector_app(store, local_dev=True, keys_path=tmp_path / "k.json", rules=m)
    (rule,) = _client_get(app, "/api/v1/rules").json()["data"]["groups"][0]["rules"]
    assert rule["health"] == "err"
    assert rule["lastError"] == "vector contains metrics with the same labelset after applying alert labels"


def test_firing_state_survives_a_restart(store, tmp_path):
    metric = "t4_gpu_temp_celsius"
    (tmp_path / "r.yml").write_text(RULES.format(metric=metric).replace("for: 30s", "for: 45s"))
    _write(store, metric, "h1", T0, [90.0] * 40)
    m = _manager(store, tmp_path / "r.yml")
    key = next(iter(m.runners))
    for i in range(5):
        m.tick(key, T0 + i * 15_000)
    assert m.groups[0].rules[1].state.value == "firing"
    # A new manager (a restarted collector) 2 minutes later: the alert fires at once, same activeAt.
    again = _manager(store, tmp_path / "r.yml")
    again.tick(key, T0 + 180_000)
    (alert,) = again.groups[0].rules[1].active.values()
    assert (alert.state.value, alert.active_at_ms) == ("firing", T0)
    # Without the restore the alert would only be pending now.
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    (fresh_dir / "r.yml").write_text((tmp_path / "r.yml").read_text().replace("GpuHot", "GpuHotFresh"))
    fresh = _manager(store, fresh_dir / "r.yml")
    fresh.tick(next(iter(fresh.runners)), T0 + 180_000)
    (f,) = fresh.groups[0].rules[1].active.values()
    assert f.state.value == "pending"


def test_reload_needs_admin_keeps_the_old_rules_on_error_and_picks_up_changes(store, tmp_path):
    metric = "t5_gpu_temp_celsius"
    path = tmp_path / "r.yml"
    path.write_text(RULES.format(metric=metric))
    tokens = TokenStore(tmp_path / "tokens.json")
    read = tokens.create("r", ["read"]).token
    admin = tokens.create("a", ["admin"]).token
    m = _manager(store, path)
    app = build_collector_app(
        store, keys_path=tmp_path / "k.json", tokens_path=tmp_path / "tokens.json", rules=m
    )
    assert (
        _client_get(app, "/-/reload", method="POST", headers={"Authorization": f"Bearer {read}"}).status_code
        == 403
    )
    path.write_text("groups: [{name: gpu, rules: [{alert: X, expr: 'up >'}]}]\n")
    r = _client_get(app, "/-/reload", method="POST", headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 400
    assert "could not parse expression" in r.json()["error"]
    assert [len(g.rules) for g in m.groups] == [2]
    path.write_text(RULES.format(metric=metric) + "      - alert: Extra\n        expr: vector(1)\n")
    r = _client_get(app, "/-/reload", method="POST", headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200, r.text
    assert [len(g.rules) for g in m.groups] == [3]


def test_alerts_reach_every_alertmanager_are_resent_and_resolve(store, tmp_path):
    metric = "t6_gpu_temp_celsius"
    (tmp_path / "r.yml").write_text(RULES.format(metric=metric).replace("for: 30s", "for: 0s"))
    _write(store, metric, "h1", T0, [90.0] * 3 + [20.0] * 5)
    with receiver() as one, receiver() as two:
        m = RuleManager(
            store,
            [str(tmp_path / "r.yml")],
            alertmanagers=[one.url, two.url],
            external_url="http://ki.test",
            resend_delay_ms=20_000,
        )
        m.load()
        m.notifier.start()
        key = next(iter(m.runners))
        for i in range(5):  # fires at T0, resent at T0+30s (> 20 s since the last send), resolves at T0+45s
            m.tick(key, T0 + i * 15_000)
        m.notifier.shutdown()
        for rec in (one, two):
            alerts = [a for batch in rec.bodies("/api/v2/alerts") for a in batch]
            assert [a["endsAt"] for a in alerts] == [
                "2027-01-15T08:01:20Z",  # valid for 4 x max(resend delay, interval) = 80 s
                "2027-01-15T08:01:50Z",
                "2027-01-15T08:00:45Z",  # resolved: endsAt is the resolution
            ]
            assert {a["startsAt"] for a in alerts} == {"2027-01-15T08:00:00Z"}
        assert m.notifier.stats.sent == {f"{one.url}/api/v2/alerts": 3, f"{two.url}/api/v2/alerts": 3}

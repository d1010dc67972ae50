// Kernel Insight web UI: one page, hash routes, the public APIs only (docs/ui.md).
// No framework: pages build HTML strings (escaped) and hand them to innerHTML once,
// which is what keeps a 1,000-instance fleet grid well under a second.
"use strict";

const TOKEN_KEY = "ki.token";
const main = document.getElementById("main");
const top_ = document.getElementById("top");
let refreshTimer = null;
let chart = null;

// ---- helpers ---------------------------------------------------------------------------

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function fmtNum(v, digits = 3) {
  if (v === null || v === undefined) return "–";
  const n = Number(v);
  if (!isFinite(n)) return String(v);
  if (n !== 0 && (Math.abs(n) >= 1e6 || Math.abs(n) < 1e-3)) return n.toExponential(digits - 1);
  return String(Math.round(n * 10 ** digits) / 10 ** digits);
}

// Axis ticks: 40G rather than 40,000,000,000 (which does not fit beside the plot).
function fmtSI(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  for (const [d, s] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) if (a >= d) return `${+(v / d).toPrecision(3)}${s}`;
  return String(+v.toPrecision(3));
}

function fmtPct(r) { return r === null || r === undefined ? "–" : `${Math.round(r * 100)}%`; }
function fmtBytes(b) { return b === null || b === undefined ? "–" : `${(b / 2 ** 30).toFixed(1)} GiB`; }
function fmtTime(ms) { return ms ? new Date(ms).toISOString().replace(".000", "") : "–"; }

// ---- units -------------------------------------------------------------------------------

// A metric's unit from its name (Prometheus' naming rules: the base unit as the last word, before
// _total, _sum or _bucket); a count (`_count`) has none.
const UNIT_SUFFIXES = [["_seconds", "s"], ["_bytes", "B"], ["_ratio", "ratio"], ["_celsius", "°C"], ["_watts", "W"], ["_hertz", "Hz"], ["_joules", "J"]];

function metricUnit(name) {
  if (/_count$/.test(name)) return "";
  const base = name.replace(/_(total|sum|bucket)$/, "");
  for (const [suffix, unit] of UNIT_SUFFIXES) if (base.endsWith(suffix)) return unit;
  return "";
}

// What a query's values are measured in, from the metrics it reads and what it does to them: ""
// where that is not clear (metrics of different units, a count, arithmetic between values). Each
// function's and aggregator's result unit is kql's (GET /ui/kql.json, `result_units`): "unitless"
// (a count, a time), "bucket_unit" (a quantile or mean of a histogram: the metric's own unit,
// however its counts were rated or summed), "ratio", "per_second" (adds "/s"); else the argument's.
function queryUnit(query) {
  const toks = lex(query);
  const metrics = toks.filter((t) => t.cls === "tok-metric").map((t) => t.tok);
  const kinds = new Set(toks.filter((t) => t.cls === "tok-fn").map((t) => RESULT_UNITS.get(t.tok)));
  const units = new Set(metrics.map(metricUnit));
  if (units.size !== 1 || kinds.has("unitless")) return "";
  if (toks.some((t) => !t.cls && /^[*/%^]$/.test(t.tok)) || toks.some((t) => t.cls === "tok-kw" && t.tok === "atan2")) return "";
  const unit = [...units][0];
  if (kinds.has("bucket_unit")) return unit;
  if (kinds.has("ratio")) return "ratio";
  if (!unit || !kinds.has("per_second")) return unit;
  return unit === "s" ? "" : `${unit}/s`; // seconds per second: a plain number (busy GPUs, say)
}

// The unit a native histogram's buckets are in: the metric's own, whatever the query did to the counts.
function bucketUnit(query) {
  const units = new Set(lex(query).filter((t) => t.cls === "tok-metric").map((t) => metricUnit(t.tok)));
  return units.size === 1 ? [...units][0] : "";
}

function fmtSeconds(v) {
  const a = Math.abs(v), sign = v < 0 ? "-" : "";
  if (a === 0) return "0 s";
  for (const [d, s] of [[1, "s"], [1e-3, "ms"], [1e-6, "µs"], [1e-9, "ns"]]) if (a >= d || s === "ns") return `${sign}${+(a / d).toPrecision(3)} ${s}`;
  return "";
}

function fmtIEC(v, suffix = "B") {
  const a = Math.abs(v);
  for (const [d, s] of [[2 ** 50, "Pi"], [2 ** 40, "Ti"], [2 ** 30, "Gi"], [2 ** 20, "Mi"], [2 ** 10, "Ki"]]) if (a >= d) return `${+(v / d).toPrecision(3)} ${s}${suffix}`;
  return `${+v.toPrecision(3)} ${suffix}`;
}

// Tick steps for bytes: 1, 2, 4, ... 512 times each power of 1024.
const BINARY_INCRS = Array.from({ length: 60 }, (_, k) => 2 ** k);

// A formatter of values in `unit` (queryUnit's), for axes, legends and hovers.
function unitFormatter(unit) {
  if (unit === "s") return (v) => (v === null || v === undefined ? "" : fmtSeconds(v));
  if (unit === "B" || unit === "B/s") return (v) => (v === null || v === undefined ? "" : fmtIEC(v, unit));
  if (unit === "ratio") return (v) => (v === null || v === undefined ? "" : `${+(v * 100).toPrecision(3)}%`);
  if (unit) return (v) => (v === null || v === undefined ? "" : `${fmtSI(v)} ${unit}`);
  return fmtSI;
}

// ---- instances by the names people gave them ---------------------------------------------

// An enrolled agent's instance id: 32 hex digits, which nobody reads. The pages show its
// enrolment name (the snapshot's `name`, `ki keys list`), else its `host` label, with the id on
// hover; other ids (remote_write's `instance` label: already a name) as they are.
const AGENT_ID = /^[0-9a-f]{32}$/;
let directory = null; // {at, byId: Map(id -> /v1/instances record), list}
const DIRECTORY_TTL_MS = 15000;

async function loadDirectory(force = false) {
  if (directory && !force && performance.now() - directory.at < DIRECTORY_TTL_MS) return directory;
  const res = await api("/v1/instances");
  directory = { at: performance.now(), byId: new Map(res.instances.map((i) => [i.id, i])), list: res.instances };
  return directory;
}

// What to call an instance: its record (or its id alone, looked up in the directory).
function instanceName(rec) {
  if (typeof rec === "string") rec = directory?.byId.get(rec) || { id: rec };
  if (rec.name) return rec.name;
  if (AGENT_ID.test(rec.id) && rec.labels?.host) return rec.labels.host;
  return rec.id;
}

// The name, with the id on hover (and beside the name where the two differ, as data-id).
function instanceHtml(rec, tag = "span") {
  const id = typeof rec === "string" ? rec : rec.id;
  const name = instanceName(rec);
  return `<${tag} class="inst" data-id="${esc(id)}" title="${esc(name === id ? id : `${name}: instance ${id}`)}">${esc(name)}</${tag}>`;
}

// Free text (an alert's summary, say) with the agent ids the collector knows shown by name.
function namedText(text) {
  return String(text).split(/([0-9a-f]{32})/).map((part, n) => (n % 2 && directory?.byId.has(part) ? instanceHtml(part) : esc(part))).join("");
}

function plural(n, one, many = `${one}s`) { return `${n} ${Number(n) === 1 ? one : many}`; }

function parseHash() {
  const h = location.hash.replace(/^#\/?/, "");
  const [path, qs] = h.split("?", 2);
  return { parts: path.split("/").map(decodeURIComponent), params: new URLSearchParams(qs || "") };
}

function setHashParams(page, params) {
  const qs = params.toString();
  history.replaceState(null, "", `#/${page}${qs ? "?" + qs : ""}`);
}

class ApiError extends Error {
  constructor(status, type, message) { super(message); this.status = status; this.type = type; }
}

// Every call carries the bearer token; a 401 sends the user back to the sign-in page.
async function api(path, opts = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  // Not signed in: show the sign-in page unless it is up already, so that a call still in flight
  // when a 401 signed the tab out does not wipe the page's message ("refused") by drawing it again.
  if (!token) { if (!document.getElementById("login")) showLogin(); throw new ApiError(401, "unauthorized", "not signed in"); }
  const headers = { Authorization: `Bearer ${token}`, ...(opts.headers || {}) };
  const res = await fetch(path, { ...opts, headers });
  let body = null;
  try { body = await res.json(); } catch (_) { body = null; }
  // The tab was signed out (another call got a 401) while this one was in flight: its answer, even
  // a good one sent while the token still worked, must not draw its page over the sign-in page.
  if (sessionStorage.getItem(TOKEN_KEY) !== token) throw new ApiError(401, "unauthorized", "signed out while the call was in flight");
  if (!res.ok) {
    if (res.status === 401) { sessionStorage.removeItem(TOKEN_KEY); showLogin("The token was refused (expired or revoked): sign in again."); }
    throw new ApiError(res.status, body?.errorType || "http", body?.error || `HTTP ${res.status}`);
  }
  return body;
}

function form(params) {
  return { method: "POST", headers: { "Content-Type": "application/x-www-form-urlencoded" }, body: new URLSearchParams(params).toString() };
}

// ---- sign-in ---------------------------------------------------------------------------

// Why the tab was signed out: the sign-in page keeps saying it when something draws it again.
let signedOutBecause = "";

function showLogin(message = signedOutBecause) {
  signedOutBecause = message || "";
  clearInterval(refreshTimer);
  top_.hidden = true;
  main.innerHTML = `<form class="login" id="login">
    <h1>Sign in to Kernel Insight</h1>
    <p class="muted">Paste a token with the <code>read</code> scope (<code>ki tokens create --scope read --name me</code>).
    It is kept in this browser tab only (sessionStorage).</p>
    <input id="token" name="token" type="password" autocomplete="off" placeholder="ki_..." required>
    <button type="submit">Sign in</button>
    <p class="error" id="login-error">${esc(message || "")}</p></form>`;
  document.getElementById("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const token = document.getElementById("token").value.trim();
    const out = document.getElementById("login-error");
    const res = await fetch("/api/v1/status/buildinfo", { headers: { Authorization: `Bearer ${token}` } });
    if (res.status === 401) { out.textContent = "This token is not known to the collector (or revoked)."; return; }
    if (res.status === 403) { out.textContent = "This token lacks the read scope."; return; }
    if (!res.ok) { out.textContent = `The collector answered HTTP ${res.status}.`; return; }
    sessionStorage.setItem(TOKEN_KEY, token);
    signedOutBecause = "";
    if (!location.hash || location.hash === "#/login") location.hash = "#/fleet";
    route();
  });
}

document.getElementById("signout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin("Signed out.");
});

// ---- fleet -----------------------------------------------------------------------------

function stateOf(i) {
  if (i.stale) return "stale";
  if (!i.healthy) return "unhealthy";
  if (i.lagging) return "lagging";
  return "healthy";
}

function labelValue(i, key) {
  if (key === "model") return i.models || [];
  const v = i.labels?.[key];
  return v === undefined ? [] : [v];
}

let fleetFirst = true;

// One cell per GPU: red above the health rule's temperature limit, amber under 10% free memory,
// grey without data (the snapshot judges instances; these say which GPU is the cause).
function gpuCells(snap, i) {
  const m = snap.gpus?.get(i.id);
  if (!m) return "";
  const hot = snap.rule?.max_temperature_celsius ?? 90;
  const cells = [...m.entries()].sort((a, b) => Number(a[0]) - Number(b[0])).map(([g, v]) => {
    const cls = v.temp > hot ? "bad" : v.free === undefined ? "stale" : v.free < 0.1 ? "low" : "";
    return `<i class="${cls}" title="GPU ${esc(g)}: free ${fmtPct(v.free)}, ${fmtNum(v.temp, 1)} °C"></i>`;
  });
  return `<div class="gpus">${cells.join("")}</div>`;
}

async function pageFleet(params) {
  main.innerHTML = `<h1>Fleet</h1><p class="muted">Loading the health snapshot…</p>`;
  const load = async () => {
    const snap = await api("/v1/health/snapshot");
    // the snapshot's records are /v1/instances': the other pages name instances from them
    directory = { at: performance.now(), byId: new Map(snap.instances.map((i) => [i.id, i])), list: snap.instances };
    renderFleet(snap, parseHash().params);
    // Per-GPU cells come from two instant queries after the grid is drawn, so the grid never waits for them.
    const [ratio, temp] = await Promise.all([
      api("/api/v1/query", form({ query: "gpu_memory_free_bytes / gpu_memory_total_bytes" })),
      api("/api/v1/query", form({ query: "gpu_temperature_celsius" })),
    ]);
    const gpus = new Map();
    const put = (res, field) => {
      for (const r of res.data.result) {
        const inst = r.metric.instance, g = r.metric.gpu;
        if (inst === undefined || g === undefined) continue;
        if (!gpus.has(inst)) gpus.set(inst, new Map());
        const m = gpus.get(inst);
        if (!m.has(g)) m.set(g, {});
        m.get(g)[field] = Number(r.value[1]);
      }
    };
    put(ratio, "free"); put(temp, "temp");
    snap.gpus = gpus;
    if (parseHash().parts[0] === "fleet" || !location.hash) renderFleet(snap, parseHash().params);
    if (window.kiFleetGpuPaintMs === undefined) requestAnimationFrame(() => { window.kiFleetGpuPaintMs = performance.now(); });
  };
  const routed = routeCount;
  await load();
  refreshEvery(routed, 15000, load);
}

function renderFleet(snap, params) {
  const key = params.get("label") || "";
  const value = params.get("value") || "";
  const state = params.get("state") || "";
  const all = snap.instances;
  const keys = new Set(["model"]);
  const values = new Set();
  for (const i of all) for (const k in i.labels || {}) if (k !== "models") keys.add(k);
  if (key) for (const i of all) for (const v of labelValue(i, key)) values.add(v);
  const shown = all.filter((i) => (!key || !value || labelValue(i, key).includes(value)) && (!state || stateOf(i) === state));
  const counts = { healthy: 0, lagging: 0, unhealthy: 0, stale: 0 };
  for (const i of all) counts[stateOf(i)]++;
  const tiles = shown.map((i) => {
    const st = stateOf(i);
    const ratio = i.gpu_memory_free_ratio;
    const reasons = (i.reasons || []).join("; ");
    const lag = i.ingest_lag_s === null || i.ingest_lag_s === undefined ? "–" : `${fmtNum(i.ingest_lag_s, 2)} s`;
    const p99 = i.nccl_latency_seconds ? `${fmtNum(i.nccl_latency_seconds.p99 * 1000, 2)} ms` : "–";
    return `<a class="tile ${st}" href="#/instance/${encodeURIComponent(i.id)}" data-id="${esc(i.id)}" data-state="${st}" title="${esc(reasons || st)}">` +
      instanceHtml(i, "b") + `${esc(st)} · ${i.fingerprint?.gpu_count === undefined ? "? GPUs" : plural(i.fingerprint.gpu_count, "GPU")}` + gpuCells(snap, i) +
      `<div class="bar"><i style="width:${ratio === null ? 0 : Math.round(ratio * 100)}%"></i></div>` +
      `free ${fmtPct(ratio)} · lag ${lag}<br>NCCL p99 ${p99} · err ${fmtNum(i.error_rate_per_s, 3)}/s` +
      (reasons ? `<div class="why">${esc(reasons)}</div>` : "") + `</a>`;
  });
  const opt = (v, cur, label) => `<option value="${esc(v)}"${v === cur ? " selected" : ""}>${esc(label ?? v)}</option>`;
  main.innerHTML = `<h1>Fleet</h1>
    <div class="toolbar">
      <label>Label <select id="f-label">${opt("", key, "(any)")}${[...keys].sort().map((k) => opt(k, key)).join("")}</select></label>
      <label>= <select id="f-value">${opt("", value, "(any)")}${[...values].sort().map((v) => opt(v, value)).join("")}</select></label>
      <label>State <select id="f-state">${opt("", state, "(any)")}${Object.keys(counts).map((s) => opt(s, state)).join("")}</select></label>
      <span class="summary" id="fleet-summary"><span>${shown.length} of ${all.length} instances</span>
        <span style="color:var(--ok)">${counts.healthy} healthy</span><span style="color:var(--lag)">${counts.lagging} lagging</span>
        <span style="color:var(--bad)">${counts.unhealthy} unhealthy</span><span style="color:var(--stale)">${counts.stale} stale</span>
        <span class="muted">as of ${fmtTime(snap.as_of_ms)}</span></span>
    </div>
    <div class="grid" id="fleet-grid">${tiles.join("")}</div>`;
  const update = () => {
    const p = new URLSearchParams();
    const k = document.getElementById("f-label").value;
    const v = k === key ? document.getElementById("f-value").value : "";
    const s = document.getElementById("f-state").value;
    if (k) p.set("label", k);
    if (v) p.set("value", v);
    if (s) p.set("state", s);
    setHashParams("fleet", p);
    renderFleet(snap, p);
  };
  for (const id of ["f-label", "f-value", "f-state"]) document.getElementById(id).addEventListener("change", update);
  if (fleetFirst) {
    fleetFirst = false;
    // The first frame that shows the grid: what `make bench-ui` reports as fleet_first_paint_ms.
    requestAnimationFrame(() => { window.kiFleetFirstPaintMs = performance.now(); });
  }
}

// ---- one instance ----------------------------------------------------------------------

async function pageInstance(id) {
  main.innerHTML = `<h1>Instance ${instanceHtml(id)}</h1><p class="muted">Loading…</p>`;
  const sel = `{instance="${id.replace(/["\\]/g, "\\$&")}"}`;
  const [rec, mem, total, temp, util] = await Promise.all([
    api(`/v1/instances/${encodeURIComponent(id)}`),
    api("/api/v1/query", form({ query: `gpu_memory_free_bytes${sel}` })),
    api("/api/v1/query", form({ query: `gpu_memory_total_bytes${sel}` })),
    api("/api/v1/query", form({ query: `gpu_temperature_celsius${sel}` })),
    api("/api/v1/query", form({ query: `gpu_sm_utilization_ratio${sel}` })),
  ]);
  const i = rec.instance;
  const gpus = new Map();
  const put = (res, field) => { for (const s of res.data.result) { const g = s.metric.gpu ?? "?"; if (!gpus.has(g)) gpus.set(g, {}); gpus.get(g)[field] = Number(s.value[1]); } };
  put(mem, "free"); put(total, "total"); put(temp, "temp"); put(util, "util");
  const rows = [...gpus.entries()].sort((a, b) => Number(a[0]) - Number(b[0])).map(([g, v]) =>
    `<tr><td>${esc(g)}</td><td class="num">${fmtBytes(v.free)}</td><td class="num">${fmtBytes(v.total)}</td>` +
    `<td class="num">${v.free !== undefined && v.total ? fmtPct(v.free / v.total) : "–"}</td>` +
    `<td class="num">${fmtNum(v.temp, 1)}</td><td class="num">${fmtPct(v.util)}</td></tr>`).join("");
  const field = (k, v) => `<tr><th>${esc(k)}</th><td>${v}</td></tr>`;
  const explore = (q) => `#/explore?${new URLSearchParams({ q, range: "1h" })}`;
  main.innerHTML = `<h1>Instance ${instanceHtml(i)} <span class="state-${stateOf(i) === "healthy" ? "inactive" : "firing"}">${esc(stateOf(i))}</span></h1>
    <table id="instance-facts">
      ${field("id", `<code>${esc(i.id)}</code>`)}
      ${field("reasons", esc((i.reasons || []).join("; ") || "none"))}
      ${field("models", esc((i.models || []).join(", ")))}
      ${field("labels", esc(Object.entries(i.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ")))}
      ${field("GPU", esc(`${i.fingerprint?.gpu_count ?? "?"} × ${i.fingerprint?.gpu_model ?? "?"}, driver ${i.fingerprint?.driver_version ?? "?"}`))}
      ${field("memory free", `${fmtBytes(i.gpu_memory_free_bytes)} of ${fmtBytes(i.gpu_memory_total_bytes)} (${fmtPct(i.gpu_memory_free_ratio)})`)}
      ${field("NCCL latency", i.nccl_latency_seconds ? esc(`p50 ${fmtNum(i.nccl_latency_seconds.p50 * 1000)} ms, p99 ${fmtNum(i.nccl_latency_seconds.p99 * 1000)} ms (${i.nccl_latency_seconds.count} ops)`) : "–")}
      ${field("errors (5 min)", esc(i.errors_5m))}
      ${field("last seen / heard", `${fmtTime(i.last_seen_ms)} / ${fmtTime(i.last_heard_ms)}`)}
      ${field("ingest lag", i.ingest_lag_s === null ? "–" : `${fmtNum(i.ingest_lag_s, 2)} s`)}
    </table>
    <h1>GPUs</h1>
    <table id="instance-gpus"><tr><th>GPU</th><th>free</th><th>total</th><th>free ratio</th><th>°C</th><th>SM use</th></tr>${rows || `<tr><td colspan="6" class="muted">no GPU gauges in the last 5 minutes</td></tr>`}</table>
    <p><a href="${explore(`gpu_memory_free_bytes${sel} / gpu_memory_total_bytes${sel}`)}">Free memory ratio per GPU in Explore</a>
      · GPU 0, last 15 minutes: <a href="#/kernels?${new URLSearchParams({ instance: i.id, gpu: 0 })}">kernels</a>,
      <a href="#/timeline?${new URLSearchParams({ instance: i.id, gpu: 0 })}">timeline</a></p>
    <h1>Recent errors</h1>
    <table><tr><th>time</th><th>GPU</th><th>kind</th><th>code</th><th>message</th></tr>${(rec.recent_errors || []).map((e) =>
      `<tr><td>${fmtTime(e.ts_ms)}</td><td>${esc(e.gpu)}</td><td>${esc(e.kind)}</td><td>${esc(e.code)}</td><td>${esc(e.message)}</td></tr>`).join("") || `<tr><td colspan="5" class="muted">none</td></tr>`}</table>`;
}

// ---- explore ---------------------------------------------------------------------------

const RANGES = { "5m": 300, "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800 };
let names = null;

async function loadNames() {
  if (names) return names;
  const [metrics, labels] = await Promise.all([api("/api/v1/label/__name__/values"), api("/api/v1/labels")]);
  names = [...new Set([...(metrics.data || []), ...(labels.data || [])])].sort();
  return names;
}

function seriesName(metric) {
  const name = metric.__name__ || "";
  const rest = Object.entries(metric).filter(([k]) => k !== "__name__").map(([k, v]) => `${k}="${v}"`).join(", ");
  return rest ? `${name}{${rest}}` : name || "{}";
}

// A fixed window from the URL (`from` and `to`, unix seconds, as the kernels and timeline pages
// pass theirs), null without one; an error message for one that is not a window.
function fixedWindow(params) {
  if (!params.has("from") && !params.has("to")) return null;
  const from = Number(params.get("from")), to = Number(params.get("to"));
  if (!params.get("from") || !params.get("to") || !Number.isFinite(from) || !Number.isFinite(to)) return { error: "from and to must both be unix seconds" };
  if (!(to > from)) return { error: "to must be after from" };
  return { from, to };
}

async function pageExplore(params) {
  const q = params.get("q") || "";
  const fixed = fixedWindow(params);
  const win = fixed && !fixed.error ? fixed : null;
  const range = win ? "window" : RANGES[params.get("range")] ? params.get("range") : "1h";
  // A fixed window is one more choice of the range list, selected; picking a relative range leaves it.
  const winOption = win ? `<option value="window" selected>${esc(fmtTime(win.from * 1000))} to ${esc(fmtTime(win.to * 1000))}</option>` : "";
  main.innerHTML = `<h1>Explore</h1>
    <div class="editor"><pre id="q-hl" aria-hidden="true"></pre><textarea id="q" spellcheck="false" placeholder="kql, e.g. sum by (instance) (gpu_memory_free_bytes)">${esc(q)}</textarea></div>
    <div class="suggest" id="suggest"></div>
    <div class="toolbar">
      <button id="run" type="button">Run</button>
      <label>Range <select id="range">${winOption}${Object.keys(RANGES).map((r) => `<option${r === range ? " selected" : ""}>${r}</option>`).join("")}</select></label>
      <span class="muted">Ctrl+Enter runs; Tab takes the first completion. The URL carries the query and range.</span>
    </div>
    ${fixed && fixed.error ? `<p class="error" id="q-window-error">Window ignored (${esc(fixed.error)}): showing the last ${range}.</p>` : ""}
    <div id="q-error"></div>
    <div class="chart" id="chart" hidden></div>
    <div id="heatmaps" hidden></div>
    <p class="muted" id="q-range"></p>
    <div id="q-table"></div>`;
  const ta = document.getElementById("q");
  const run = () => {
    const chosen = document.getElementById("range").value;
    const p = new URLSearchParams(chosen === "window" ? { q: ta.value, from: win.from, to: win.to } : { q: ta.value, range: chosen });
    setHashParams("explore", p);
    runQuery(ta.value, chosen === "window" ? win : null, RANGES[chosen]);
  };
  document.getElementById("run").addEventListener("click", run);
  document.getElementById("range").addEventListener("change", run);
  ta.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); run(); }
    if (ev.key === "Tab") {
      const first = document.querySelector("#suggest button");
      if (first) { ev.preventDefault(); first.click(); }
    }
  });
  const hl = document.getElementById("q-hl");
  const paint = () => { hl.innerHTML = highlight(ta.value) + "\n"; hl.scrollTop = ta.scrollTop; hl.scrollLeft = ta.scrollLeft; };
  ta.addEventListener("input", () => { paint(); suggest(ta); });
  ta.addEventListener("scroll", paint);
  paint();
  vocabulary.then(paint);
  // Typed before the names arrived: complete it now that they are here.
  loadNames().then(() => { if (document.activeElement === ta) suggest(ta); }).catch(() => {});
  if (q) runQuery(q, win, RANGES[range]);
}

// Syntax highlighting under the (transparent) textarea: strings, numbers and durations, comments,
// keywords, function names (an identifier before "("), label names (an identifier before an
// operator inside braces or a grouping list) and metric names. A lexer only, never an error:
// errors are the API's to report (showError).
// The words come from the collector (GET /ui/kql.json: kql's grammar and registries); until they
// arrive only strings, numbers, comments, labels and names are told apart.
let KEYWORDS = new Set(), CALL_KEYWORDS = new Set(), AGGREGATORS = new Set(), GROUPING = new Set(), RESULT_UNITS = new Map();
const vocabulary = fetch("/ui/kql.json").then((r) => r.json()).then((v) => {
  KEYWORDS = new Set(v.keywords); CALL_KEYWORDS = new Set(v.call_keywords);
  AGGREGATORS = new Set(v.aggregators); GROUPING = new Set(v.grouping);
  RESULT_UNITS = new Map(Object.entries(v.result_units));
}).catch(() => {});
const TOKEN = /(#[^\n]*)|("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|`[^`]*`?)|(\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*|0x[0-9a-fA-F]+|\d*\.?\d+(?:[eE][+-]?\d+)?|Inf|NaN)|([A-Za-z_:][A-Za-z0-9_:]*)|([\s\S])/g;

function highlight(text) {
  return lex(text).map(({ tok, cls }) => (cls ? `<span class="${cls}">${esc(tok)}</span>` : esc(tok))).join("");
}

// The query's tokens, each with its highlighting class ("" for operators, brackets and space).
function lex(text) {
  const out = [];
  let depth = 0, m, grouping = false, inList = false;
  TOKEN.lastIndex = 0;
  while ((m = TOKEN.exec(text))) {
    const [tok, comment, str, num, ident] = m;
    let cls = "";
    if (comment) cls = "tok-comment";
    else if (str) cls = "tok-str";
    else if (num) cls = "tok-num";
    else if (ident) {
      const rest = text.slice(TOKEN.lastIndex);
      const word = ident.toLowerCase();
      if (KEYWORDS.has(word) && (!CALL_KEYWORDS.has(word) || /^\s*\(/.test(rest))) { cls = "tok-kw"; grouping = GROUPING.has(word); }
      else if (inList || depth > 0 || /^\s*(=~|!~|!=|=)/.test(rest)) cls = "tok-label";
      else if (/^\s*\(/.test(rest) || (AGGREGATORS.has(ident) && /^\s*(by|without)\b/i.test(rest))) cls = "tok-fn";
      else cls = "tok-metric";
    } else if (tok === "(" && grouping) { inList = true; grouping = false; }
    else if (tok === ")" && inList) inList = false;
    else if (tok === "{") depth++;
    else if (tok === "}") depth = Math.max(0, depth - 1);
    out.push({ tok, cls });
  }
  return out;
}

// Completion: the identifier before the cursor against metric and label names from the API.
function suggest(ta) {
  const box = document.getElementById("suggest");
  const before = ta.value.slice(0, ta.selectionStart);
  const word = (before.match(/[A-Za-z_:][A-Za-z0-9_:]*$/) || [""])[0];
  if (!names || word.length < 2) { box.innerHTML = ""; return; }
  const hits = names.filter((n) => n.startsWith(word) && n !== word).slice(0, 12);
  box.innerHTML = hits.map((n) => `<button type="button" data-name="${esc(n)}">${esc(n)}</button>`).join("");
  for (const b of box.querySelectorAll("button")) {
    b.addEventListener("click", () => {
      const at = ta.selectionStart;
      ta.value = ta.value.slice(0, at - word.length) + b.dataset.name + ta.value.slice(at);
      ta.selectionStart = ta.selectionEnd = at - word.length + b.dataset.name.length;
      box.innerHTML = "";
      ta.focus();
    });
  }
}

// Parse and type errors come back as 'invalid parameter "query": line:col: parse error: message'
// (Prometheus 3's text, docs/kql.md): mark the spot.
function showError(query, err) {
  const box = document.getElementById("q-error");
  const m = /^(?:invalid parameter "query": )?(\d+):(\d+): /.exec(err.message);
  let caret = "";
  if (m) {
    const line = Number(m[1]), col = Number(m[2]);
    const text = query.split("\n")[line - 1] ?? "";
    caret = `<div class="caret" id="q-caret">${esc(text)}\n${" ".repeat(Math.max(0, col - 1))}^</div>`;
    const ta = document.getElementById("q");
    const offset = query.split("\n").slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0) + col - 1;
    ta.focus();
    ta.setSelectionRange(offset, Math.min(query.length, offset + 1));
  }
  box.innerHTML = `<p class="error" id="q-message">${esc(err.type)}: ${esc(err.message)}</p>${caret}`;
}

// Over `win` ({from, to}, unix seconds) when the page has a fixed window, else the last `rangeS`
// seconds; the instant query at the range's end.
async function runQuery(query, win, rangeS) {
  document.getElementById("q-error").innerHTML = "";
  document.getElementById("q-table").innerHTML = `<p class="muted">Running…</p>`;
  const end = win ? win.to : Date.now() / 1000;
  const start = win ? win.from : end - rangeS;
  const step = Math.max(1, Math.ceil((end - start) / 240));
  const shown = document.getElementById("q-range");
  Object.assign(shown.dataset, { start: String(start), end: String(end), step: String(step) });
  shown.textContent = `range ${fmtTime(start * 1000)} to ${fmtTime(end * 1000)} (UTC), ${step} s steps; the table at its end`;
  let inst, rng;
  try {
    [inst, rng] = await Promise.all([
      api("/api/v1/query", form({ query, time: end })),
      api("/api/v1/query_range", form({ query, start, end, step })).catch((e) => e),
    ]);
  } catch (err) {
    document.getElementById("q-table").innerHTML = "";
    document.getElementById("chart").hidden = true;
    document.getElementById("heatmaps").hidden = true;
    showError(query, err);
    return;
  }
  renderTable(inst.data, inst.warnings, win ? fmtTime(end * 1000) : "now");
  await vocabulary; // the chart's unit (queryUnit) needs kql's result units
  if (rng instanceof Error) {
    document.getElementById("chart").hidden = true;
    document.getElementById("heatmaps").hidden = true;
    showError(query, rng);
  } else {
    renderChart(rng.data, query);
    renderHeatmaps(rng.data, query);
  }
}

function renderTable(data, warnings, at) {
  const out = document.getElementById("q-table");
  const warn = (warnings || []).map((w) => `<p class="muted">warning: ${esc(w)}</p>`).join("");
  if (data.resultType === "scalar" || data.resultType === "string") {
    out.innerHTML = `${warn}<table id="result-table"><tr><th>${data.resultType}</th></tr><tr><td class="num">${esc(data.result[1])}</td></tr></table>`;
    return;
  }
  const rows = data.result.map((s) => {
    const h = s.histogram && s.histogram[1];
    const v = s.value ? s.value[1] : s.values ? `${s.values.length} samples` : h ? `histogram: count ${h.count}, sum ${h.sum}, ${(h.buckets || []).length} buckets` : "";
    return `<tr><td>${esc(seriesName(s.metric))}</td><td class="num">${esc(v)}</td></tr>`;
  });
  out.innerHTML = `${warn}<p class="muted">${rows.length} series (instant, ${esc(at)})</p>
    <table id="result-table"><tr><th>series</th><th>value</th></tr>${rows.join("") || `<tr><td colspan="2" class="muted">no data</td></tr>`}</table>`;
}

const PALETTE = ["#4a7bd0", "#d23c3c", "#2e9b4f", "#d9a400", "#8e44ad", "#16a085", "#e67e22", "#34495e", "#c0392b", "#7f8c8d"];

// The legend names each series by the labels that tell it from the others (all of them on hover):
// 13 kernels' `kernel_duration_seconds{instance="...", gpu="0", kernel="..."}` are their kernels.
function shortNames(metrics) {
  const keys = new Set(metrics.flatMap((m) => Object.keys(m)));
  const varying = [...keys].filter((k) => new Set(metrics.map((m) => m[k])).size > 1);
  if (!varying.length || metrics.length < 2) return metrics.map(seriesName);
  if (varying.length === 1 && varying[0] !== "__name__") return metrics.map((m) => m[varying[0]] ?? seriesName(m));
  return metrics.map((m) => varying.filter((k) => m[k] !== undefined).map((k) => (k === "__name__" ? m[k] : `${k}="${m[k]}"`)).join(", ") || seriesName(m));
}

function renderChart(data, query) {
  const box = document.getElementById("chart");
  if (chart) { chart.destroy(); chart = null; }
  // Native-histogram series are drawn as heatmaps (renderHeatmaps); the chart has the float ones.
  const floats = data.resultType === "matrix" ? data.result.filter((s) => s.values && s.values.length) : [];
  if (floats.length === 0) { box.hidden = true; box.dataset.series = "0"; return; }
  // Every series of a range query sits on the same step grid: align them on the union of times.
  const times = [...new Set(floats.flatMap((s) => s.values.map((v) => v[0])))].sort((a, b) => a - b);
  const index = new Map(times.map((t, n) => [t, n]));
  const cols = floats.map((s) => {
    const col = new Array(times.length).fill(null);
    for (const [t, v] of s.values || []) col[index.get(t)] = Number(v);
    return col;
  });
  box.hidden = false;
  box.innerHTML = "";
  box.dataset.series = String(floats.length);
  const unit = queryUnit(query || "");
  const fmt = unitFormatter(unit);
  box.dataset.unit = unit;
  const labels = shortNames(floats.map((s) => s.metric));
  const opts = {
    width: Math.max(400, box.clientWidth - 14),
    height: 320,
    series: [{}, ...floats.map((s, n) => ({ label: labels[n], stroke: PALETTE[n % PALETTE.length], width: 1.5, spanGaps: false, value: (u, v) => (v === null ? "–" : fmt(v)) }))],
    // bytes: ticks at binary steps (16 GiB, not 18.6 GiB)
    axes: [{}, { size: 76, values: (u, vals) => vals.map(fmt), ...(unit.startsWith("B") ? { incrs: BINARY_INCRS } : {}) }],
    legend: { live: true },
  };
  chart = new uPlot(opts, [times, ...cols], box);
  box.querySelectorAll(".u-legend tr.u-series").forEach((row, n) => { if (n > 0) row.title = seriesName(floats[n - 1].metric); });
}

// Native histograms (Prometheus' "histograms" in a range result: [ts, {count, sum, buckets: [[rule,
// lo, hi, count], ...]}]) as heatmaps, the way Grafana draws them: one column per step, rows on a
// log scale of the bucket boundaries, darker = more observations per row. A bucket spreads its count
// over the rows it covers in proportion to the log-width it shares with each; the zero bucket and
// negative buckets go to the bottom row. At most 8 series are drawn.
const HEAT_ROWS = 48;
const MAX_HEATMAPS = 8;

function renderHeatmaps(data, query) {
  const box = document.getElementById("heatmaps");
  const hs = data.resultType === "matrix" ? data.result.filter((s) => s.histograms && s.histograms.length) : [];
  box.hidden = hs.length === 0;
  box.dataset.heatmaps = String(hs.length);
  if (!hs.length) { box.innerHTML = ""; return; }
  const times = [...new Set(hs.flatMap((s) => s.histograms.map((p) => p[0])))].sort((a, b) => a - b);
  const shown = hs.slice(0, MAX_HEATMAPS);
  box.innerHTML = shown.map((s, n) => `<div class="chart heatmap"><div class="muted">${esc(seriesName(s.metric))} (native histogram)</div>
      <canvas id="hm-${n}"></canvas><div class="muted hm-hover" id="hm-hover-${n}">&nbsp;</div></div>`).join("")
    + (hs.length > shown.length ? `<p class="muted">${hs.length - shown.length} more histogram series not drawn</p>` : "");
  const fmt = unitFormatter(bucketUnit(query || ""));
  box.dataset.unit = bucketUnit(query || "");
  shown.forEach((s, n) => drawHeatmap(document.getElementById(`hm-${n}`), document.getElementById(`hm-hover-${n}`), s.histograms, times, fmt));
}

function heatGrid(points, times) {
  let lo = Infinity, hi = 0;
  for (const [, h] of points) for (const [, a, b] of h.buckets || []) {
    const l = Number(a), u = Number(b);
    if (l > 0 && l < lo) lo = l;
    if (u > 0 && u > hi && Number.isFinite(u)) hi = u;
  }
  if (!(hi > 0)) return null;
  if (!(lo < hi)) lo = hi / 2;
  const llo = Math.log(lo), span = Math.log(hi) - llo;
  const col = new Map(times.map((t, n) => [t, n]));
  const cells = new Float64Array(times.length * HEAT_ROWS);
  for (const [t, h] of points) {
    const c = col.get(t);
    for (const [, a, b, cnt] of h.buckets || []) {
      const l = Number(a), u = Number(b), v = Number(cnt);
      if (!(v > 0)) continue;
      if (u <= lo || l <= 0) { cells[c * HEAT_ROWS] += v; continue; } // zero and negative buckets
      const r0 = ((Math.log(l) - llo) / span) * HEAT_ROWS, r1 = ((Math.log(Math.min(u, hi)) - llo) / span) * HEAT_ROWS;
      const width = Math.max(r1 - r0, 1e-9);
      for (let r = Math.max(0, Math.floor(r0)); r < Math.min(HEAT_ROWS, Math.ceil(r1)); r++) {
        cells[c * HEAT_ROWS + r] += (v * (Math.min(r + 1, r1) - Math.max(r, r0))) / width;
      }
    }
  }
  let max = 0;
  for (const v of cells) if (v > max) max = v;
  return { lo, hi, llo, span, cells, max };
}

// `axis` (a kernel page's timeAxis): draw on that shared time axis, `times` being its columns' ends.
function drawHeatmap(canvas, hover, points, times, fmtY, axis = null) {
  const grid = heatGrid(points, times);
  const LEFT = axis ? HEAT_LEFT : 64, BOTTOM = 18, height = 240;
  const width = axis ? axis.width : Math.max(400, canvas.parentElement.clientWidth - 14);
  canvas.width = width * devicePixelRatio; canvas.height = height * devicePixelRatio;
  canvas.style.width = `${width}px`; canvas.style.height = `${height}px`;
  canvas.dataset.columns = String(times.length);
  canvas.dataset.observations = grid ? String(Math.round(grid.cells.reduce((a, b) => a + b, 0))) : "0";
  const ctx = canvas.getContext("2d");
  ctx.scale(devicePixelRatio, devicePixelRatio);
  ctx.font = "11px system-ui, sans-serif";
  if (axis) {
    const filled = [];
    if (grid) for (let c = 0; c < times.length; c++) if (grid.cells.subarray(c * HEAT_ROWS, (c + 1) * HEAT_ROWS).some((v) => v > 0)) filled.push(c);
    markAxis(canvas, axis, filled);
    drawTimeAxis(ctx, axis, LEFT, width, height);
  }
  if (!grid || grid.max <= 0) { ctx.fillText("no observations in the range", LEFT, 20); return; }
  const cw = (width - LEFT) / times.length, rh = (height - BOTTOM) / HEAT_ROWS;
  for (let c = 0; c < times.length; c++) {
    for (let r = 0; r < HEAT_ROWS; r++) {
      const v = grid.cells[c * HEAT_ROWS + r];
      if (v <= 0) continue;
      // sqrt keeps a straggler row visible next to the bulk of the distribution
      const k = Math.sqrt(v / grid.max);
      ctx.fillStyle = `rgb(${Math.round(235 - 205 * k)}, ${Math.round(240 - 170 * k)}, ${Math.round(250 - 90 * k)})`;
      ctx.fillRect(LEFT + c * cw, height - BOTTOM - (r + 1) * rh, Math.ceil(cw), Math.ceil(rh));
    }
  }
  ctx.fillStyle = "#555";
  for (let k = 0; k <= 4; k++) {
    const b = Math.exp(grid.llo + (grid.span * k) / 4);
    ctx.fillText(fmtY(b), 4, height - BOTTOM - (k * (height - BOTTOM)) / 4 + (k === 0 ? -2 : 10));
  }
  if (!axis) {
    for (let k = 0; k <= 4; k++) {
      const t = times[Math.min(times.length - 1, Math.round(((times.length - 1) * k) / 4))];
      ctx.textAlign = k === 0 ? "left" : k === 4 ? "right" : "center";
      ctx.fillText(new Date(t * 1000).toLocaleTimeString(), LEFT + ((width - LEFT) * k) / 4, height - 4);
      ctx.textAlign = "left";
    }
  }
  canvas.onmousemove = (ev) => {
    const rect = canvas.getBoundingClientRect();
    const c = Math.floor((ev.clientX - rect.left - LEFT) / cw), r = HEAT_ROWS - 1 - Math.floor((ev.clientY - rect.top) / rh);
    if (c < 0 || c >= times.length || r < 0 || r >= HEAT_ROWS) return;
    const a = Math.exp(grid.llo + (grid.span * r) / HEAT_ROWS), b = Math.exp(grid.llo + (grid.span * (r + 1)) / HEAT_ROWS);
    const when = axis ? `${utcClock(axis.t0 + c * axis.step, axis)} to ${utcClock(axis.t0 + (c + 1) * axis.step, axis)} UTC` : new Date(times[c] * 1000).toLocaleTimeString();
    hover.textContent = `${when}  ${fmtY(a)} .. ${fmtY(b)}: ${fmtSI(grid.cells[c * HEAT_ROWS + r])}`;
  };
}

// ---- alerts ----------------------------------------------------------------------------

async function pageAlerts() {
  main.innerHTML = `<h1>Alerts</h1><p class="muted">Loading…</p>`;
  const load = async () => {
    const [rules, alerts] = await Promise.all([api("/api/v1/rules"), api("/api/v1/alerts"), loadDirectory()]);
    renderAlerts(rules.data.groups || [], alerts.data.alerts || []);
  };
  const routed = routeCount;
  await load();
  refreshEvery(routed, 10000, load);
}

function renderAlerts(groups, alerts) {
  // the instance label by its name, the id on hover
  const labels = (l) => Object.entries(l || {}).map(([k, v]) => `${esc(k)}=${k === "instance" ? instanceHtml(v) : esc(v)}`).join(", ");
  const firing = alerts.map((a) => `<tr class="alert" data-state="${esc(a.state)}"><td class="state-${esc(a.state)}">${esc(a.state)}</td>` +
    `<td>${esc(a.labels?.alertname)}</td><td>${labels(a.labels)}</td><td>${esc(a.activeAt)}</td><td class="num">${esc(a.value)}</td>` +
    `<td>${namedText(a.annotations?.summary || a.annotations?.description || "")}</td></tr>`).join("");
  const rules = groups.map((g) => `<h1>Group ${esc(g.name)} <span class="muted">(${esc(g.file)}, every ${esc(g.interval)} s, last ${esc(g.lastEvaluation)}, took ${fmtNum(g.evaluationTime * 1000, 2)} ms)</span></h1>
    <table class="rules"><tr><th>rule</th><th>type</th><th>state</th><th>health</th><th>last evaluation</th><th>query</th></tr>${g.rules.map((r) =>
      `<tr><td>${esc(r.name)}</td><td>${esc(r.type)}</td><td class="state-${esc(r.state || "inactive")}">${esc(r.state || "–")}</td>` +
      `<td>${esc(r.health)}${r.lastError ? `<div class="error">${esc(r.lastError)}</div>` : ""}</td><td>${esc(r.lastEvaluation)}</td>` +
      `<td><a href="#/explore?${new URLSearchParams({ q: r.query, range: "1h" })}"><code>${esc(r.query)}</code></a></td></tr>`).join("")}</table>`).join("");
  main.innerHTML = `<h1>Alerts <span class="muted">(${alerts.filter((a) => a.state === "firing").length} firing, ${alerts.filter((a) => a.state === "pending").length} pending)</span></h1>
    <table id="alerts"><tr><th>state</th><th>alert</th><th>labels</th><th>active since</th><th>value</th><th>summary</th></tr>${firing || `<tr><td colspan="6" class="muted">no pending or firing alerts</td></tr>`}</table>
    ${rules || `<p class="muted">No rule groups: start the collector with <code>--rules FILE</code> (docs/rules.md).</p>`}`;
}

// ---- kernels and timeline: one GPU's window (/v1/timeline/*) ------------------------------

// The window a kernels or timeline page looks at: instance, GPU and [from, to) in unix seconds.
function windowOf(params) {
  const now = Date.now() / 1000;
  const to = Number(params.get("to")) || now;
  const from = Number(params.get("from")) || to - 900;
  // pod: Kubernetes, only the spans run while that pod held the GPU (null: every span)
  return { instance: params.get("instance") || "", gpu: params.get("gpu") || "0", from, to, pod: params.get("pod") };
}

// The window form: an instance picker (the collector's instances by name, the id on hover and in
// the URL), the instance's GPUs, and the window in UTC. A URL's instance the collector does not
// know stays listed, marked, so the page can say what is empty.
function windowForm(w, dir) {
  const iso = (t) => new Date(t * 1000).toISOString().slice(0, 19);
  const known = [...dir.list].sort((a, b) => instanceName(a).localeCompare(instanceName(b)));
  const opts = known.map((i) => `<option value="${esc(i.id)}" title="${esc(i.id)}"${i.id === w.instance ? " selected" : ""}>${esc(instanceName(i))}${instanceName(i) === i.id ? "" : ` (${esc(i.id.slice(0, 8))}…)`}</option>`);
  if (w.instance && !dir.byId.has(w.instance)) opts.unshift(`<option value="${esc(w.instance)}" selected>${esc(w.instance)} (not known to the collector)</option>`);
  if (!w.instance) opts.unshift(`<option value="" selected disabled>pick an instance (${known.length})</option>`);
  const count = dir.byId.get(w.instance)?.fingerprint?.gpu_count || 0;
  const gpus = Array.from({ length: Math.max(count, 1) }, (_, g) => String(g));
  if (!gpus.includes(w.gpu)) gpus.push(w.gpu);
  return `<form class="toolbar" id="w-form">
    <label>Instance <select id="w-instance" required>${opts.join("")}</select></label>
    <label>GPU <select id="w-gpu">${gpus.map((g) => `<option${g === w.gpu ? " selected" : ""}>${esc(g)}</option>`).join("")}</select></label>
    <label>From (UTC) <input id="w-from" value="${iso(w.from)}" size="20"></label>
    <label>To <input id="w-to" value="${iso(w.to)}" size="20"></label>
    <label>Pod <input id="w-pod" value="${esc(w.pod || "")}" size="16" placeholder="any"></label>
    <button type="submit">Show</button></form>`;
}

// Picking an instance or a GPU shows it at once; the times wait for "Show".
function bindWindowForm(page) {
  const f = document.getElementById("w-form");
  const go = () => {
    const t = (id) => Date.parse(document.getElementById(id).value + "Z") / 1000;
    const inst = document.getElementById("w-instance").value;
    if (!inst) return;
    const gpu = document.getElementById("w-gpu").value;
    const p = new URLSearchParams({ instance: inst, gpu: gpu, from: t("w-from"), to: t("w-to") });
    const pod = document.getElementById("w-pod").value.trim();
    if (pod) p.set("pod", pod);
    location.hash = `#/${page}?${p}`;
  };
  f.addEventListener("submit", (ev) => { ev.preventDefault(); go(); });
  document.getElementById("w-instance").addEventListener("change", () => { document.getElementById("w-gpu").value = "0"; go(); });
  document.getElementById("w-gpu").addEventListener("change", go);
}

// The window of a page opened without an instance: the only instance when there is one.
function defaultInstance(w, dir) {
  if (!w.instance && dir.list.length === 1) w.instance = dir.list[0].id;
  return w;
}

// What is wrong with a window, before the API is asked (it would answer 400, the same words): "" if nothing.
function windowProblem(w) {
  if (!/^\d+$/.test(w.gpu) || Number(w.gpu) > 65535) return `GPU must be a number from 0 to 65535, not "${w.gpu}".`;
  if (!(w.to > w.from)) return "The window's end must be after its start.";
  if (w.to - w.from > 86400) return `The window is ${Math.round(w.to - w.from)} s long; at most 24 hours (86400 s).`;
  return "";
}

function windowQuery(w) {
  const q = new URLSearchParams({ instance: w.instance, gpu: w.gpu, from: w.from, to: w.to });
  if (w.pod != null) q.set("pod", w.pod);
  return q;
}

function fmtNs(ns) {
  if (ns === null || ns === undefined) return "–";
  if (ns >= 1e9) return `${fmtNum(ns / 1e9, 3)} s`;
  if (ns >= 1e6) return `${fmtNum(ns / 1e6, 3)} ms`;
  if (ns >= 1e3) return `${fmtNum(ns / 1e3, 3)} µs`;
  return `${ns} ns`;
}

// The kernels page's two heatmaps (a kernel's spans, its native histogram) share one time axis, so
// that a column of one is the same stretch of time as the column under it in the other, whatever
// each has data for: HEAT_COLS columns of `step` seconds from the window's start, the step in whole
// milliseconds (what the range query's step is), at the same left edge and width: the width of
// the page's box (`width`, CSS pixels).
const HEAT_COLS = 120, HEAT_LEFT = 70, HEAT_MIN_WIDTH = 480;

function timeAxis(w, width) {
  const stepMs = Math.max(1, Math.ceil(((w.to - w.from) * 1000) / HEAT_COLS));
  const cols = Math.max(1, Math.ceil(((w.to - w.from) * 1000) / stepMs));
  const axis = { t0: w.from, step: stepMs / 1000, cols, t1: w.from + (cols * stepMs) / 1000, width: Math.max(HEAT_MIN_WIDTH, Math.floor(width)) };
  // Five ticks, at the start, the quarters and the end; in milliseconds only where a column is
  // under a second and a tick falls between seconds (wider columns: the nearest second is within
  // half a column, and "12:08:25.352" is noise over a 15-minute window).
  const at = [0, 1, 2, 3, 4].map((k) => axis.t0 + ((axis.t1 - axis.t0) * k) / 4);
  axis.ms = axis.step < 1 && at.some((t) => Math.round(t * 1000) % 1000 !== 0);
  axis.ticks = at.map((t) => ({ t, label: utcClock(t, axis) }));
  return axis;
}

function utcClock(t, axis) {
  return axis.ms ? new Date(Math.round(t * 1000)).toISOString().slice(11, 23) : new Date(Math.round(t) * 1000).toISOString().slice(11, 19);
}

// Ticks and their times under a heatmap on `axis`: the same for every heatmap drawn on it.
function drawTimeAxis(ctx, axis, left, width, height) {
  ctx.save();
  ctx.fillStyle = "#555"; ctx.strokeStyle = "#999";
  axis.ticks.forEach(({ label }, k) => {
    const x = left + ((width - left) * k) / 4;
    ctx.beginPath(); ctx.moveTo(x + 0.5, height - 17); ctx.lineTo(x + 0.5, height - 13); ctx.stroke();
    ctx.textAlign = k === 0 ? "left" : k === 4 ? "right" : "center";
    ctx.fillText(label, x, height - 3);
  });
  ctx.restore();
}

// The axis a heatmap canvas is drawn on, and its columns with data, for tests and for whoever reads
// the page's DOM: equal attributes on two canvases mean equal x axes.
function markAxis(canvas, axis, filled) {
  const runs = [];
  for (const c of filled) {
    if (runs.length && runs[runs.length - 1][1] === c - 1) runs[runs.length - 1][1] = c;
    else runs.push([c, c]);
  }
  Object.assign(canvas.dataset, {
    t0: String(axis.t0), t1: String(axis.t1), step: String(axis.step), columns: String(axis.cols),
    ticks: axis.ticks.map((k) => k.label).join(" "), filled: runs.map(([a, b]) => `${a}-${b}`).join(","),
  });
}

async function pageKernels(params) {
  const dir = await loadDirectory();
  const w = defaultInstance(windowOf(params), dir);
  main.innerHTML = `<h1>Kernels</h1>${windowForm(w, dir)}<div id="k-body"></div>`;
  bindWindowForm("kernels");
  if (!w.instance) { document.getElementById("k-body").innerHTML = `<p class="muted" id="w-pick">Pick an instance and a GPU.</p>`; return; }
  const problem = windowProblem(w);
  if (problem) { document.getElementById("k-body").innerHTML = `<p class="error" id="w-error">${esc(problem)}</p>`; return; }
  const q = windowQuery(w);
  q.set("kernels", "100");
  const s = await api(`/v1/timeline/summary?${q}`);
  const link = (k) => `#/kernels?${windowQuery(w)}&kernel=${encodeURIComponent(k)}`;
  // Each kernel is counted from one source: its native histograms where they grew in the window,
  // else its kept spans (a key the agent's full histogram table refused, say). When both occur,
  // the rows from spans are marked: they count only the spans the agent kept.
  const anyHist = s.kernels.some((k) => k.source === "histograms");
  const fromSpans = anyHist ? s.kernels.filter((k) => k.source === "spans").length : 0;
  const mark = (k) => (anyHist && k.source === "spans" ? ` <span class="muted source">kept spans</span>` : "");
  const rows = s.kernels.map((k) => `<tr class="kernel" data-kernel="${esc(k.kernel)}" data-source="${esc(k.source)}"><td><a href="${link(k.kernel)}"><code>${esc(k.kernel)}</code></a>${mark(k)}</td><td class="num">${k.count}</td>` +
    `<td class="num">${fmtNs(k.total_ns)}</td><td class="num">${fmtPct(k.share)}</td><td class="num">${fmtNs(k.p50_ns)}</td>` +
    `<td class="num">${fmtNs(k.p90_ns)}</td><td class="num">${fmtNs(k.p99_ns)}</td><td class="num">${fmtNs(k.max_ns)}</td></tr>`).join("");
  const kernel = params.get("kernel");
  document.getElementById("k-body").innerHTML = `<p>${s.span_count} spans, ${fmtNs(s.total_ns)} of kernel time, GPU busy ${fmtPct(s.busy_ratio)}
    · <a href="#/timeline?${windowQuery(w)}">open the timeline</a> · a kernel's name opens its latency heatmap</p>
    ${anyHist ? `<p class="muted" id="k-source">Counts, time and quantiles from the kernels' native histograms (every launch)${fromSpans ? `, but for the ${fromSpans} marked <em>kept spans</em>: no histogram of theirs grew in this window, so they count only the spans the agent kept` : ""}; the ${s.span_count} spans are the ones the agent kept (the slow tail, a sample, capture windows).</p>` : ""}
    <table id="kernels"><tr><th>kernel</th><th>count</th><th>total</th><th>share</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>${rows || `<tr><td colspan="8" class="muted">no kernel spans in this window</td></tr>`}</table>
    <div id="k-heatmap"></div>
    <div id="k-native"></div>`;
  // A heatmap's box (.chart: 6 px padding and a 1 px border each side) as wide as the page's body.
  const bodyBox = getComputedStyle(document.getElementById("k-body"));
  const axis = timeAxis(w, document.getElementById("k-body").clientWidth - parseFloat(bodyBox.paddingLeft) - parseFloat(bodyBox.paddingRight) - 14);
  if (kernel) await Promise.all([kernelHeatmap(w, kernel, axis), kernelNativeHeatmap(w, kernel, axis)]);
}

// How far apart a series' samples are, from the data (the way Grafana's $__rate_interval uses the
// scrape interval): the newest sample's time from `timestamp(sel)` over the axis, then the raw
// samples of the two minutes up to it (exact for exports under a minute apart; the axis' own
// columns for slower ones). The median gap; null when no series has two samples.
async function sampleInterval(sel, axis) {
  const coarse = await api("/api/v1/query_range", form({ query: `timestamp(${sel})`, start: axis.t0 + axis.step, end: axis.t1, step: axis.step }));
  let last = -Infinity;
  const gaps = [], fine = [];
  for (const s of coarse.data.result) {
    let prev = null;
    for (const [, v] of s.values || []) {
      const t = Number(v);
      if (t > last) last = t;
      if (prev !== null && t > prev) gaps.push(t - prev);
      prev = t;
    }
  }
  if (last === -Infinity) return { interval: null, samples: 0 };
  const raw = await api("/api/v1/query", form({ query: `${sel}[2m]`, time: last }));
  let samples = 0;
  for (const s of raw.data.result) {
    const ts = (s.histograms || s.values || []).map((p) => Number(p[0]));
    samples = Math.max(samples, ts.length);
    for (let i = 1; i < ts.length; i++) if (ts[i] > ts[i - 1]) fine.push(ts[i] - ts[i - 1]);
  }
  const pick = (fine.length ? fine : gaps).sort((a, b) => a - b);
  return { interval: pick.length ? pick[pick.length >> 1] : null, samples: Math.max(samples, gaps.length + 1) };
}

// A rate's range over a chart of `stepS` columns whose samples come every `intervalS`: a column
// and one interval (so no increase falls between two columns' ranges), and at least four
// intervals (so a range always holds two samples, a late or skipped one included): Grafana's
// $__rate_interval. In whole milliseconds.
function rateRangeMs(stepS, intervalS) {
  return Math.ceil(Math.max(stepS + intervalS, 4 * intervalS) * 1000);
}

// The same kernel's latency from its native histogram (kernel_duration_seconds, shipped by the agent
// every histogram_interval_s, 7 s by default, while the kernel runs): any window, every launch
// counted, not only the spans the agent kept.
async function kernelNativeHeatmap(w, kernel, axis) {
  const box = document.getElementById("k-native");
  const str = (v) => `"${String(v).replace(/\\/g, "\\\\").replace(/"/g, '\\"')}"`;
  const sel = `kernel_duration_seconds{instance=${str(w.instance)}, gpu=${str(w.gpu)}, kernel=${str(kernel)}${w.pod != null ? `, pod=${str(w.pod)}` : ""}}`;
  // One point per column, at the column's end, so the columns hold the same time as the span
  // heatmap's; a point the query has no data for leaves its column empty. The rate's range comes
  // from the exports' own interval (rateRangeMs): a range shorter than two exports has no rate.
  let res, interval, stepMs, rangeMs, query;
  try {
    ({ interval } = await sampleInterval(sel, axis));
    if (interval !== null) {
      stepMs = Math.round(axis.step * 1000);
      rangeMs = rateRangeMs(axis.step, interval);
      query = `sum(rate(${sel}[${rangeMs}ms]))`;
      res = await api("/api/v1/query_range", form({ query, start: axis.t0 + axis.step, end: axis.t1, step: axis.step }));
    }
  } catch (err) {
    box.innerHTML = `<p class="error">${esc(String(err.message || err))}</p>`;
    return;
  }
  const series = res ? res.data.result.filter((s) => s.histograms && s.histograms.length) : [];
  if (!series.length) {
    const what = interval === null && res === undefined
      ? "its agent exported its native histogram (<code>kernel_duration_seconds</code>) fewer than twice near this window, and a rate needs two exports"
      : "no two exports of its native histogram (<code>kernel_duration_seconds</code>) fall within a rate's range in this window";
    box.innerHTML = `<p class="muted" id="native-none">No heatmap from the native histogram of this kernel: ${what}. The agent exports a kernel's histogram every <code>histogram_interval_s</code> (7 s by default) while the kernel runs; a kernel left out of its histogram table (<code>histogram_max_keys</code>) has spans only. Try a wider window.</p>`;
    return;
  }
  const explore = `#/explore?${new URLSearchParams({ q: query, from: w.from, to: w.to })}`;
  box.innerHTML = `<h1>From its native histogram</h1>
    <p class="muted" id="native-info" data-interval="${interval}" data-range-ms="${rangeMs}">every launch in the window, rate per second over ${fmtNs(rangeMs * 1e6)} (the exports come every ${fmtNs(Math.round(interval * 1e9))}: a range of at least four, or of a column and one), ${fmtNs(stepMs * 1e6)} columns (the time axis of the span heatmap above) · <a href="${explore}" id="native-explore">open the query in Explore</a></p>
    <div class="chart heatmap"><canvas id="native-heatmap"></canvas><div class="muted hm-hover" id="native-hover">&nbsp;</div></div>`;
  // Each point goes to the column it ends, by its time, not by its place in the answer: a series that
  // starts late or has gaps keeps its columns where the span heatmap has them.
  const times = Array.from({ length: axis.cols }, (_, c) => axis.t0 + (c + 1) * axis.step);
  const points = [];
  for (const [t, h] of series[0].histograms) {
    const c = Math.round((t - axis.t0) / axis.step) - 1;
    if (c >= 0 && c < axis.cols) points.push([times[c], h]);
  }
  drawHeatmap(document.getElementById("native-heatmap"), document.getElementById("native-hover"), points, times, (v) => fmtNs(Math.round(v * 1e9)), axis);
}

const HEATMAP_MAX_SPANS = 50000;

// Latency over time for one kernel: time columns x log-duration rows, darker = more spans.
async function kernelHeatmap(w, kernel, axis) {
  const box = document.getElementById("k-heatmap");
  box.innerHTML = `<p class="muted">Loading the spans of ${esc(kernel)}…</p>`;
  const re = kernel.replace(/[\\^$.|?*+()[\]{}]/g, "\\$&"); // the API anchors the RE2 regex
  const start = [], dur = [];
  let cursor = null;
  do {
    const q = windowQuery(w);
    q.set("kernel", re); q.set("limit", "10000");
    if (cursor) q.set("cursor", cursor);
    const page = await api(`/v1/timeline/spans?${q}`);
    for (const sp of page.spans) { start.push(sp.start_ns); dur.push(sp.duration_ns); }
    cursor = page.next_cursor;
  } while (cursor && start.length < HEATMAP_MAX_SPANS);
  const COLS = axis.cols, ROWS = 40, W = axis.width, H = 320, LEFT = HEAT_LEFT, BOTTOM = 20;
  const t0 = axis.t0 * 1e9, stepNs = axis.step * 1e9;
  const dMin = dur.reduce((m, d) => (d < m ? d : m), Infinity), dMax = dur.reduce((m, d) => (d > m ? d : m), 0);
  const lo = Math.log(Math.max(1, Math.min(dMin, dMax))), hi = Math.log(Math.max(2, dMax)) + 1e-9;
  const bins = new Uint32Array(COLS * ROWS);
  let maxCount = 0;
  for (let i = 0; i < start.length; i++) {
    const c = Math.max(0, Math.min(COLS - 1, Math.floor((start[i] - t0) / stepNs)));
    const r = Math.min(ROWS - 1, Math.floor((Math.log(Math.max(1, dur[i])) - lo) / (hi - lo) * ROWS));
    const n = ++bins[r * COLS + c];
    if (n > maxCount) maxCount = n;
  }
  box.innerHTML = `<h1>Latency heatmap: <code>${esc(kernel)}</code></h1>
    <p class="muted" id="heatmap-info">${start.length} spans${cursor ? ` (the first ${start.length}: the window holds more; narrow it)` : ""}; duration on a log scale, ${fmtNs(Math.round(Math.exp(lo)))} to ${fmtNs(Math.round(Math.exp(hi)))}; ${axis.cols} columns of ${fmtNs(Math.round(axis.step * 1e9))}; darker: more spans</p>
    <div class="chart heatmap"><canvas id="heatmap" data-spans="${start.length}" data-truncated="${cursor ? "true" : "false"}" data-max-count="${maxCount}"></canvas></div>`;
  const canvas = document.getElementById("heatmap");
  canvas.width = W * devicePixelRatio; canvas.height = H * devicePixelRatio;
  canvas.style.width = `${W}px`; canvas.style.height = `${H}px`;
  const ctx = canvas.getContext("2d");
  ctx.scale(devicePixelRatio, devicePixelRatio);
  ctx.fillStyle = "#fff"; ctx.fillRect(LEFT, 0, W - LEFT, H - BOTTOM);
  const cw = (W - LEFT) / COLS, rh = (H - BOTTOM) / ROWS;
  for (let r = 0; r < ROWS; r++) for (let c = 0; c < COLS; c++) {
    const n = bins[r * COLS + c];
    if (!n) continue;
    const k = Math.sqrt(n / maxCount);
    ctx.fillStyle = `rgb(${Math.round(230 - 200 * k)}, ${Math.round(238 - 170 * k)}, ${Math.round(255 - 110 * k)})`;
    ctx.fillRect(LEFT + c * cw, H - BOTTOM - (r + 1) * rh, Math.ceil(cw), Math.ceil(rh));
  }
  ctx.fillStyle = "#1c1f24"; ctx.font = "11px system-ui, sans-serif";
  for (let k = 0; k <= 4; k++) {
    const d = Math.exp(lo + (hi - lo) * k / 4);
    ctx.fillText(fmtNs(Math.round(d)), 2, H - BOTTOM - (H - BOTTOM) * k / 4 + (k === 0 ? -2 : k === 4 ? 10 : 4));
  }
  drawTimeAxis(ctx, axis, LEFT, W, H);
  const filled = [];
  for (let c = 0; c < COLS; c++) for (let r = 0; r < ROWS; r++) if (bins[r * COLS + c]) { filled.push(c); break; }
  markAxis(canvas, axis, filled);
}

const LANE_H = 22;
// Launch arrows are drawn only while at most this many launches are in view (each frame stays cheap).
const MAX_ARROWS = 300;
const CALL_COLOURS = { alloc: "#2e9b4f", alloc_async: "#2e9b4f", free: "#e67e22", free_async: "#e67e22", memcpy: "#4a7bd0" };
const COLOURS = ["#4a7bd0", "#2e9b4f", "#d9a400", "#8e44ad", "#16a085", "#e67e22", "#c0392b", "#34495e"];

// What a timeline without spans says: which window of which GPU is empty, and what to try. Whether
// the collector knows the instance at all comes from its instance list (a 404 from
// /v1/instances/ID would be one more error in the browser's console for a plain "no such name").
async function emptyTimelineNote(w) {
  let known = null;
  try {
    known = (await loadDirectory(true)).byId.has(w.instance);
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) throw err;
  }
  const now = Math.floor(Date.now() / 1000);
  const around = (s) => `#/timeline?${windowQuery({ ...w, from: now - s, to: now })}`;
  const tips = [];
  if (known === false) tips.push(`The collector knows no instance <code>${esc(w.instance)}</code> (none reports health under that name): check the name on the <a href="#/fleet">Fleet</a> page, or start its agent.`);
  if (w.pod != null) tips.push(`Only the spans run while pod <code>${esc(w.pod)}</code> held the GPU are shown: <a href="#/timeline?${windowQuery({ ...w, pod: null })}" id="t-empty-any-pod">every span of the window</a>.`);
  tips.push(`Try a wider window: <a href="${around(3600)}" id="t-empty-hour">the last hour</a> or <a href="${around(86400)}">the last 24 hours</a> (a window is at most 24 hours).`);
  tips.push(`The agent ships the slow tail and a sample of the spans only (and every span of a capture window, <code>ki timeline capture</code>), so a GPU can run kernels the timeline never shows: the <a href="#/kernels?${windowQuery(w)}">Kernels</a> page counts every launch of this window from the kernels' native histograms.`);
  return `<div class="placeholder" id="t-empty" data-known="${known === null ? "" : String(known)}">
    <p><b>No kernel spans</b> of ${instanceHtml(w.instance, "code")} GPU ${esc(w.gpu)} from ${esc(fmtTime(w.from * 1000))} to ${esc(fmtTime(w.to * 1000))}.</p>
    <ul>${tips.map((t) => `<li>${t}</li>`).join("")}</ul></div>`;
}

async function pageTimeline(params) {
  const dir = await loadDirectory();
  const w = defaultInstance(windowOf(params), dir);
  main.innerHTML = `<h1>Timeline</h1>${windowForm(w, dir)}<div id="t-body"></div>`;
  bindWindowForm("timeline");
  const body = document.getElementById("t-body");
  if (!w.instance) { body.innerHTML = `<p class="muted" id="w-pick">Pick an instance and a GPU.</p>`; return; }
  const problem = windowProblem(w);
  if (problem) { body.innerHTML = `<p class="error" id="w-error">${esc(problem)}</p>`; return; }
  body.innerHTML = `<p class="muted" id="t-status">Loading spans…</p>`;
  // Every page of the window (10,000 spans each), into columns: a 100,000-span window is ~10 requests.
  const names = [], nameIx = new Map(), streams = new Map(), threads = new Map(), owners = [""], ownerIx = new Map([["", 0]]);
  let start = [], dur = [], lane = [], kern = [], launch = [], thread = [], hostNs = [], own = [];
  const origin = Math.floor(w.from) * 1e9;
  let cursor = null;
  do {
    const q = windowQuery(w);
    q.set("limit", "10000");
    if (cursor) q.set("cursor", cursor);
    const page = await api(`/v1/timeline/spans?${q}`);
    for (const s of page.spans) {
      if (!streams.has(String(s.stream))) streams.set(String(s.stream), streams.size);
      if (!nameIx.has(s.kernel)) { nameIx.set(s.kernel, names.length); names.push(s.kernel); }
      start.push(s.start_ns - origin); dur.push(s.duration_ns); lane.push(streams.get(String(s.stream))); kern.push(nameIx.get(s.kernel));
      // the Kubernetes pod that held the GPU when the span ran ("" when none did)
      const owner = s.pod ? `pod ${s.namespace}/${s.pod} (${s.container})` : "";
      if (!ownerIx.has(owner)) { ownerIx.set(owner, owners.length); owners.push(owner); }
      own.push(ownerIx.get(owner));
      // the host side (CUDA-event probe): when and on which thread the kernel was launched
      if (s.launch_ns) {
        const key = `${s.pid}:${s.tid}`;
        if (!threads.has(key)) threads.set(key, threads.size);
        launch.push(s.launch_ns - origin); thread.push(threads.get(key)); hostNs.push(s.launch_host_ns);
      } else { launch.push(NaN); thread.push(0); hostNs.push(0); }
    }
    cursor = page.next_cursor;
    const st = document.getElementById("t-status");
    if (st) st.textContent = `Loading spans… ${start.length}`;
  } while (cursor);
  // The GPU's NVML counters and events of the same window, as tracks under the streams.
  const corr = await api(`/v1/timeline/correlation?${windowQuery(w)}`);
  const tracks = Object.entries(corr.counters || {}).map(([name, pts]) => {
    const vs = pts.map((p) => p[1]);
    // its unit from its name (memory_used_bytes; sm_utilization is gpu_sm_utilization_ratio's)
    const unit = metricUnit(name) || (name.endsWith("utilization") ? "ratio" : "");
    return { name, fmt: unitFormatter(unit), t: Float64Array.from(pts.map((p) => p[0] * 1e6 - origin)), v: Float64Array.from(vs), lo: Math.min(...vs), hi: Math.max(...vs) };
  });
  const events = (corr.events || []).map((e) => ({ t: e.ts_ns - origin, text: `${e.kind} ${e.code}${e.message ? ": " + e.message : ""}` }));
  // The GPU's other calls (gpu_calls): a lane each for NCCL operations, memory operations and syncs.
  const callLane = (name, rows, truncated) => ({
    name, truncated, rows,
    t: Float64Array.from(rows.map((c) => c.ts_ns - origin)),
    d: Float64Array.from(rows.map((c) => c.duration_ns || 0)),
    maxDur: rows.reduce((m, c) => Math.max(m, c.duration_ns || 0), 0),
  });
  const calls = [
    callLane("NCCL", corr.nccl || [], corr.nccl_truncated),
    callLane("memory", corr.memory || [], corr.memory_truncated),
    callLane("syncs", corr.syncs || [], corr.syncs_truncated),
  ].filter((c) => c.rows.length);
  const tl = {
    start: Float64Array.from(start), dur: Float64Array.from(dur), lane: Uint16Array.from(lane), kern: Uint32Array.from(kern),
    names, lanes: [...streams.keys()], maxDur: dur.reduce((m, d) => (d > m ? d : m), 0), own: Uint32Array.from(own), owners,
    t0: 0, t1: (w.to - Math.floor(w.from)) * 1e9, offset: (w.from - Math.floor(w.from)) * 1e9,
  };
  tl.t0 = tl.offset;
  // Launches in launch-time order, for the host lanes and the arrows of the frame's view.
  const L = Float64Array.from(launch), T = Uint16Array.from(thread), H = Float64Array.from(hostNs);
  const order = [];
  for (let i = 0; i < L.length; i++) if (!Number.isNaN(L[i])) order.push(i);
  order.sort((a, b) => L[a] - L[b]);
  tl.launchOrder = Uint32Array.from(order);
  tl.launchT = Float64Array.from(order, (i) => L[i]);
  tl.launchTh = T; tl.launchHost = H; tl.threads = [...threads.keys()];
  // Per thread, its launches' times and host ns in time order: each frame paints a thread's lane
  // one pixel column at a time, jumping past the launches a column already covers.
  tl.threadT = tl.threads.map(() => []); tl.threadH = tl.threads.map(() => []);
  for (const i of order) { tl.threadT[T[i]].push(L[i]); tl.threadH[T[i]].push(H[i]); }
  tl.threadT = tl.threadT.map((a) => Float64Array.from(a)); tl.threadH = tl.threadH.map((a) => Float64Array.from(a));
  tl.maxHost = H.reduce((m, h) => (h > m ? h : m), 0);
  tl.maxLead = order.reduce((m, i) => Math.max(m, tl.start[i] - L[i], H[i]), 0);
  tl.arrows = 0; tl.inView = 0;
  start = dur = lane = kern = launch = thread = hostNs = own = null;
  // No spans: say so, and what to try, rather than draw empty lanes. The GPU's other data of the
  // window (NVML samples, calls, events), if any, is still drawn under the note.
  const empty = tl.start.length === 0 ? await emptyTimelineNote(w) : "";
  if (empty && !tracks.some((k) => k.t.length) && !calls.length && !events.length) { body.innerHTML = empty; return; }
  body.innerHTML = `${empty}<div class="toolbar"><span id="t-count" data-spans="${tl.start.length}" data-lanes="${tl.lanes.length}" data-tracks="${esc(tracks.map((k) => `${k.name}:${k.t.length}`).join(","))}" data-events="${events.length}" data-threads="${tl.threads.length}" data-launches="${tl.launchOrder.length}" data-calls="${esc(calls.map((c) => `${c.name}:${c.rows.length}`).join(","))}">${tl.start.length} spans on ${tl.lanes.length} streams${tl.threads.length ? `, launched from ${tl.threads.length} host threads` : ""}</span>
      <span class="muted">wheel: zoom · drag: pan · double-click: whole window</span>
      <button type="button" id="t-export">Open in Perfetto (download trace)</button>
      <span id="t-range" class="muted"></span> <span id="t-arrows" class="muted"></span></div>
    <canvas id="t-canvas"></canvas><div id="t-hover" class="muted"></div>
    <ul id="t-events">${events.map((e) => `<li class="error">+${fmtNs(Math.round(e.t - tl.offset))}: ${esc(e.text)}</li>`).join("")}</ul>
    <p class="muted">Host threads: each kernel's launch on the thread that made it (CUDA-event probe), with an arrow to the kernel once at most ${MAX_ARROWS} launches are in view.
    NCCL: collectives as the host saw them (red: failed). Memory: allocations (green), frees (orange) and copies (blue), taller for more bytes. Syncs: host waits on the GPU (those of 50 µs or more, and 1 in 100 of the shorter ones).
    Memory and SM use are the GPU's NVML samples; red lines are its events.${calls.filter((c) => c.truncated).map((c) => ` Only the first ${c.rows.length} ${c.name} calls of the window are drawn: narrow it to see the rest.`).join("")}</p>`;
  const canvas = document.getElementById("t-canvas");
  const ctx = canvas.getContext("2d");
  const rangeNote = document.getElementById("t-arrows");
  // The canvas's box is body's content box (clientWidth counts the padding too: a canvas that
  // wide overflowed by it and the page scrolled sideways).
  const bodyBox = getComputedStyle(body);
  const width = Math.max(200, Math.floor(body.clientWidth - parseFloat(bodyBox.paddingLeft) - parseFloat(bodyBox.paddingRight)));
  const TRACK_H = 40;
  // Top to bottom: time axis, host threads, streams, NCCL / memory / syncs, NVML counters.
  const hostTop = 24;
  const streamsTop = hostTop + (tl.threads.length ? tl.threads.length * LANE_H + 6 : 0);
  const callsTop = streamsTop + tl.lanes.length * LANE_H + 6;
  const tracksTop = callsTop + (calls.length ? calls.length * LANE_H + 6 : 0);
  const height = tracksTop + tracks.length * (TRACK_H + 6);
  canvas.width = width * devicePixelRatio; canvas.height = height * devicePixelRatio;
  canvas.style.width = `${width}px`; canvas.style.height = `${height}px`;
  ctx.scale(devicePixelRatio, devicePixelRatio);
  const LEFT = 150;
  // Host threads: a mark per launch (at most one per pixel column of a lane) and, when few enough
  // launches are in view, an arrow from each to its kernel's start on its stream.
  // First index of sorted array a at or after t (from index lo).
  const lowerBound = (a, t, lo = 0) => {
    let hi = a.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (a[m] < t) lo = m + 1; else hi = m; }
    return lo;
  };
  const drawLaunches = (t0, t1, scale) => {
    const n = tl.launchT.length;
    ctx.fillStyle = "#1c1f24";
    tl.threads.forEach((k, j) => ctx.fillText(`host thread ${k.split(":")[1]}`, 4, hostTop + j * LANE_H + 14));
    if (!n) return;
    const lo = lowerBound(tl.launchT, t0 - tl.maxLead), end = lowerBound(tl.launchT, t1 + 1e-9, lo);
    tl.inView = end - lo;
    const marks = new Path2D();
    tl.threadT.forEach((tt, th) => {
      const hh = tl.threadH[th], y = hostTop + th * LANE_H + 4;
      // Marks that touch are merged into one run (a busy thread is one bar, not thousands of
      // slivers: rasterising each sliver cost more than the rest of the frame).
      let runFrom = -1, runTo = -1;
      let k = lowerBound(tt, t0 - tl.maxHost);
      while (k < tt.length && tt[k] <= t1) {
        const x0 = Math.floor(Math.max(LEFT, LEFT + (tt[k] - t0) * scale));
        const x1 = Math.min(width, Math.max(x0 + 1, Math.ceil(LEFT + (tt[k] + hh[k] - t0) * scale)));
        if (x0 <= runTo + 1) runTo = Math.max(runTo, x1);
        else { if (runTo > runFrom) marks.rect(runFrom, y, runTo - runFrom, LANE_H - 8); runFrom = x0; runTo = x1; }
        k = lowerBound(tt, t0 + (x1 - LEFT) / scale, k + 1); // the next launch past this pixel column
      }
      if (runTo > runFrom) marks.rect(runFrom, y, runTo - runFrom, LANE_H - 8);
    });
    ctx.fillStyle = "#7f8c8d"; ctx.fill(marks);
    tl.arrows = 0;
    if (tl.inView > MAX_ARROWS) return;
    const arrows = new Path2D();
    for (let k = lo; k < end; k++) {
      const i = tl.launchOrder[k];
      const xa = LEFT + (tl.launchT[k] - t0) * scale, ya = hostTop + tl.launchTh[i] * LANE_H + LANE_H - 4;
      const xb = LEFT + (tl.start[i] - t0) * scale, yb = streamsTop + tl.lane[i] * LANE_H + 2;
      if (Math.max(xa, xb) < LEFT || Math.min(xa, xb) > width) continue;
      arrows.moveTo(xa, ya); arrows.lineTo(xb, yb);
      arrows.moveTo(xb - 3, yb - 5); arrows.lineTo(xb, yb); arrows.lineTo(xb + 3, yb - 5);
      tl.arrows++;
    }
    ctx.save(); ctx.beginPath(); ctx.rect(LEFT, 0, width - LEFT, height); ctx.clip();
    ctx.strokeStyle = "rgba(28, 31, 36, 0.55)"; ctx.lineWidth = 1; ctx.stroke(arrows); ctx.restore();
  };
  // NCCL, memory and sync lanes: slices for calls with a duration, ticks (height: log of the bytes) for memory.
  const drawCalls = (t0, t1, scale) => {
    calls.forEach((c, j) => {
      const top = callsTop + j * LANE_H;
      ctx.fillStyle = "#1c1f24";
      ctx.fillText(c.name, 4, top + 14);
      let lo = 0, hi = c.t.length;
      const from = t0 - c.maxDur;
      while (lo < hi) { const m = (lo + hi) >> 1; if (c.t[m] < from) lo = m + 1; else hi = m; }
      for (let i = lo; i < c.t.length && c.t[i] <= t1; i++) {
        const row = c.rows[i];
        const x0 = Math.max(LEFT, LEFT + (c.t[i] - t0) * scale), x1 = Math.min(width, LEFT + (c.t[i] + c.d[i] - t0) * scale);
        if (x1 < LEFT || x0 > width) continue;
        if (c.name === "memory") {
          const h = Math.max(3, Math.min(LANE_H - 4, Math.log2(Math.max(row.bytes, 2)) / 40 * (LANE_H - 4)));
          ctx.fillStyle = CALL_COLOURS[row.op] || "#555";
          ctx.fillRect(x0, top + LANE_H - 2 - h, 2, h);
          continue;
        }
        ctx.fillStyle = row.failed ? "#d23c3c" : c.name === "NCCL" ? "#8e44ad" : "#95a5a6";
        ctx.fillRect(x0, top + 2, Math.max(1, x1 - x0), LANE_H - 4);
        if (x1 - x0 > 60) {
          ctx.save(); ctx.beginPath(); ctx.rect(x0, top, x1 - x0 - 2, LANE_H); ctx.clip();
          ctx.fillStyle = "#fff"; ctx.fillText(row.op, x0 + 3, top + 15); ctx.restore();
        }
      }
    });
  };
  const draw = () => {
    const { t0, t1 } = tl;
    const scale = (width - LEFT) / (t1 - t0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#1c1f24";
    for (let l = 0; l < tl.lanes.length; l++) ctx.fillText(`stream 0x${Number(tl.lanes[l]).toString(16)}`, 4, streamsTop + l * LANE_H + 14);
    // first span that can reach t0: binary search on start - maxDur
    let lo = 0, hi = tl.start.length;
    const from = t0 - tl.maxDur;
    while (lo < hi) { const m = (lo + hi) >> 1; if (tl.start[m] < from) lo = m + 1; else hi = m; }
    const paths = COLOURS.map(() => new Path2D());
    const lastPx = new Float64Array(tl.lanes.length).fill(-1);
    const labels = [];
    for (let i = lo; i < tl.start.length; i++) {
      const s = tl.start[i];
      if (s > t1) break;
      const e = s + tl.dur[i];
      if (e < t0) continue;
      const l = tl.lane[i];
      let x0 = LEFT + (s - t0) * scale, x1 = LEFT + (e - t0) * scale;
      if (x1 <= lastPx[l]) continue; // this pixel column of the lane is painted already
      x0 = Math.max(x0, lastPx[l], LEFT); x1 = Math.min(Math.max(x1, x0 + 1), width);
      lastPx[l] = x1;
      paths[tl.kern[i] % COLOURS.length].rect(x0, streamsTop + l * LANE_H + 2, x1 - x0, LANE_H - 4);
      if (x1 - x0 > 50 && labels.length < 500) labels.push([i, x0, x1, l]);
    }
    paths.forEach((p, n) => { ctx.fillStyle = COLOURS[n]; ctx.fill(p); });
    ctx.fillStyle = "#fff";
    for (const [i, x0, x1, l] of labels) {
      ctx.save(); ctx.beginPath(); ctx.rect(x0, streamsTop + l * LANE_H, x1 - x0 - 2, LANE_H); ctx.clip();
      ctx.fillText(tl.names[tl.kern[i]], x0 + 3, streamsTop + l * LANE_H + 15); ctx.restore();
    }
    drawLaunches(t0, t1, scale);
    drawCalls(t0, t1, scale);
    // counters: a step line per track, scaled to its own range over the window
    tracks.forEach((k, n) => {
      const top = tracksTop + n * (TRACK_H + 6);
      ctx.fillStyle = "#1c1f24";
      // the name (its unit is on the scale) between its scale's two ends
      ctx.fillText(k.name.replace(/_bytes$/, "").replace(/_/g, " "), 4, top + TRACK_H / 2 + 4);
      // its scale: the window's highest and lowest sample, in its unit, at the left edge
      ctx.fillStyle = "#555";
      ctx.textAlign = "right";
      ctx.fillText(k.fmt(k.hi), LEFT - 4, top + 10);
      ctx.fillText(k.fmt(k.lo), LEFT - 4, top + TRACK_H - 2);
      ctx.textAlign = "left";
      ctx.strokeStyle = "#d8dbe0"; ctx.strokeRect(LEFT, top, width - LEFT, TRACK_H);
      ctx.beginPath(); ctx.strokeStyle = n ? "#2e9b4f" : "#4a7bd0";
      const y = (v) => top + TRACK_H - 2 - (k.hi > k.lo ? (v - k.lo) / (k.hi - k.lo) : 0.5) * (TRACK_H - 4);
      let started = false;
      for (let i = 0; i < k.t.length; i++) {
        const x = LEFT + (k.t[i] - t0) * scale;
        const xn = i + 1 < k.t.length ? LEFT + (k.t[i + 1] - t0) * scale : width;
        if (xn < LEFT || x > width) continue;
        const xa = Math.max(x, LEFT), xb = Math.min(xn, width);
        if (!started) { ctx.moveTo(xa, y(k.v[i])); started = true; } else ctx.lineTo(xa, y(k.v[i]));
        ctx.lineTo(xb, y(k.v[i]));
      }
      ctx.stroke();
    });
    // events: a red line through every lane
    ctx.strokeStyle = "#d23c3c";
    for (const e of events) {
      const x = LEFT + (e.t - t0) * scale;
      if (x < LEFT || x > width) continue;
      ctx.beginPath(); ctx.moveTo(x, 16); ctx.lineTo(x, height); ctx.stroke();
    }
    ctx.fillStyle = "#555";
    for (let k = 0; k <= 4; k++) {
      const t = t0 + (t1 - t0) * k / 4;
      ctx.fillText(`+${fmtNs(Math.round(t - tl.offset))}`, LEFT + (width - LEFT - 60) * k / 4, 12);
    }
    document.getElementById("t-range").textContent = `showing ${fmtNs(Math.round(t1 - t0))}`;
    // Written only when it changes: a line of text that changes length every frame re-lays out the page.
    const note = tl.launchT.length && tl.inView > MAX_ARROWS ? `more than ${MAX_ARROWS} launches in view: zoom in for launch arrows` : "";
    if (rangeNote.textContent !== note) rangeNote.textContent = note;
  };
  const clamp = () => {
    const full = [tl.offset, (w.to - Math.floor(w.from)) * 1e9];
    const span = Math.max(1000, Math.min(tl.t1 - tl.t0, full[1] - full[0]));
    tl.t0 = Math.min(Math.max(tl.t0, full[0]), full[1] - span); tl.t1 = tl.t0 + span;
  };
  let pending = false;
  const redraw = () => { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; draw(); }); } };
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const at = tl.t0 + (Math.max(ev.offsetX, LEFT) - LEFT) / (width - LEFT) * (tl.t1 - tl.t0);
    const k = ev.deltaY > 0 ? 1.25 : 0.8;
    tl.t0 = at - (at - tl.t0) * k; tl.t1 = at + (tl.t1 - at) * k; clamp(); redraw();
  }, { passive: false });
  let drag = null;
  canvas.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, t0: tl.t0, t1: tl.t1 }; });
  window.addEventListener("mouseup", () => { drag = null; });
  canvas.addEventListener("mousemove", (ev) => {
    if (drag) {
      const dt = (ev.clientX - drag.x) / (width - LEFT) * (drag.t1 - drag.t0);
      tl.t0 = drag.t0 - dt; tl.t1 = drag.t1 - dt; clamp(); redraw();
      return;
    }
    const call = callAt(ev.offsetX, ev.offsetY);
    if (call) { document.getElementById("t-hover").textContent = call; return; }
    const i = spanAt(ev.offsetX, ev.offsetY);
    document.getElementById("t-hover").textContent = i < 0 ? "" :
      `${tl.names[tl.kern[i]]} · stream 0x${Number(tl.lanes[tl.lane[i]]).toString(16)} · start +${fmtNs(Math.round(tl.start[i] - tl.offset))} · ${fmtNs(tl.dur[i])}${tl.own[i] ? ` · ${tl.owners[tl.own[i]]}` : ""}`;
  });
  // The span under the pointer, or the nearest one of that lane within 3 pixels; -1 for none.
  const spanAt = (x, y) => {
    const l = Math.floor((y - streamsTop) / LANE_H);
    if (l < 0 || l >= tl.lanes.length || x < LEFT) return -1;
    const perPx = (tl.t1 - tl.t0) / (width - LEFT);
    const t = tl.t0 + (x - LEFT) * perPx, slack = 3 * perPx;
    let lo = 0, hi = tl.start.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (tl.start[m] <= t + slack) lo = m + 1; else hi = m; }
    let best = -1, bestGap = Infinity;
    for (let i = lo - 1; i >= 0 && tl.start[i] >= t - tl.maxDur - slack; i--) {
      if (tl.lane[i] !== l) continue;
      const gap = t < tl.start[i] ? tl.start[i] - t : Math.max(0, t - tl.start[i] - tl.dur[i]);
      if (gap < bestGap) { best = i; bestGap = gap; if (gap === 0) break; }
    }
    return bestGap <= slack ? best : -1;
  };
  // The NCCL, memory or sync call under the pointer (or within 3 pixels), described; "" for none.
  const callAt = (x, y) => {
    const j = Math.floor((y - callsTop) / LANE_H);
    if (j < 0 || j >= calls.length || x < LEFT) return "";
    const c = calls[j], perPx = (tl.t1 - tl.t0) / (width - LEFT);
    const t = tl.t0 + (x - LEFT) * perPx, slack = 3 * perPx;
    let best = -1, bestGap = Infinity;
    for (let i = 0; i < c.t.length; i++) {
      const gap = t < c.t[i] ? c.t[i] - t : Math.max(0, t - c.t[i] - c.d[i]);
      if (gap < bestGap) { best = i; bestGap = gap; }
    }
    if (best < 0 || bestGap > slack) return "";
    const r = c.rows[best];
    const size = r.bytes ? ` · ${fmtSI(r.bytes)}B` : "";
    const took = r.duration_ns ? ` · ${fmtNs(r.duration_ns)}` : "";
    return `${c.name} ${r.op}${size}${took} · start +${fmtNs(Math.round(c.t[best] - tl.offset))}${r.failed ? " · FAILED" : ""}${r.nranks ? ` · rank ${r.rank} of ${r.nranks}` : ""}`;
  };
  canvas.addEventListener("dblclick", () => { tl.t0 = tl.offset; tl.t1 = (w.to - Math.floor(w.from)) * 1e9; redraw(); });
  document.getElementById("t-export").addEventListener("click", async () => {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const res = await fetch(`/v1/timeline/export?${windowQuery(w)}`, { headers: { Authorization: `Bearer ${token}` } });
    if (!res.ok) { document.getElementById("t-hover").textContent = `export failed: HTTP ${res.status}`; return; }
    const a = document.createElement("a");
    a.href = URL.createObjectURL(await res.blob());
    a.download = `ki-${w.instance}-gpu${w.gpu}.trace.json`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  });
  // For tests and make bench-ui: pan by `px` per frame for `ms` and report frames per second.
  window.kiTimeline = {
    view: () => ({ t0: tl.t0, t1: tl.t1, spans: tl.start.length, arrows: tl.arrows, launchesInView: tl.inView }),
    layout: () => ({ hostTop, streamsTop, callsTop, tracksTop, laneH: LANE_H, left: LEFT, calls: calls.map((c) => c.name) }),
    spanAt: (x, y) => spanAt(x, y),
    zoom: (k) => { const m = (tl.t0 + tl.t1) / 2; tl.t0 = m - (m - tl.t0) * k; tl.t1 = m + (tl.t1 - m) * k; clamp(); draw(); },
    panFps: (ms, px) => new Promise((resolve) => {
      let frames = 0, dir = 1;
      const began = performance.now();
      const step = (now) => {
        const dt = dir * px / (width - LEFT) * (tl.t1 - tl.t0);
        const before = tl.t0;
        tl.t0 += dt; tl.t1 += dt; clamp();
        if (tl.t0 === before) dir = -dir; // bounce at either end of the window
        draw(); frames++;
        if (now - began < ms) requestAnimationFrame(step); else resolve(frames * 1000 / (now - began));
      };
      requestAnimationFrame(step);
    }),
  };
  draw();
}

// ---- router ----------------------------------------------------------------------------

// Counts route() calls: a page whose first load ends after the user moved on starts no refresh,
// which would otherwise keep calling the collector behind the page now shown.
let routeCount = 0;

function refreshEvery(routed, ms, load) {
  if (routed === routeCount) refreshTimer = setInterval(() => load().catch(() => {}), ms);
}

async function route() {
  const routed = ++routeCount;
  clearInterval(refreshTimer);
  if (!sessionStorage.getItem(TOKEN_KEY)) { if (!document.getElementById("login")) showLogin(); return; }
  top_.hidden = false;
  const { parts, params } = parseHash();
  const page = parts[0] || "fleet";
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.page === page);
  try {
    if (page === "fleet") await pageFleet(params);
    else if (page === "instance") await pageInstance(parts.slice(1).join("/"));
    else if (page === "explore") await pageExplore(params);
    else if (page === "alerts") await pageAlerts();
    else if (page === "kernels") await pageKernels(params);
    else if (page === "timeline") await pageTimeline(params);
    else main.innerHTML = `<h1>Not found</h1><p>No page <code>${esc(page)}</code>. <a href="#/fleet">Fleet</a></p>`;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return;
    // A page the user has left (its elements gone from under its late answers) says nothing.
    if (routed !== routeCount) return;
    main.innerHTML = `<h1>Error</h1><p class="error" id="page-error">${esc(err.message)}</p>`;
  }
}

// Only a change of page re-renders; filters and queries rewrite the hash with replaceState.
window.addEventListener("hashchange", route);
route();

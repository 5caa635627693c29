// vf-sandbox dashboard: a hash-routed single page over the JSON API in dashboard.py.
// #/                     runs list (live)
// #/run/ID[/TAB]         one run: metrics | samples | instances | log
// #/run/ID/samples/IDX   one sample (raw row, per-turn timing, error details)
// #/compare/ID1,ID2,...  runs side by side with overlaid reward histograms
"use strict";

const $view = document.getElementById("view");
const $live = document.getElementById("live");
let timer = null;            // the current view's refresh timer
let gen = 0;                 // bumps on every navigation; stale async renders bail out
const filters = { status: "", env: "", model: "", kind: "" };

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
const fmt = (x, d = 3) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : Number(x).toFixed(d);
function dur(s) {
  s = Math.max(0, Math.round(s || 0));
  if (s >= 3600) return `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
}
const when = ts => ts ? new Date(ts * 1000).toLocaleString() : "–";
async function api(path, opts) {
  const r = await fetch(path, opts);
  if (!r.ok) throw new Error(`${r.status} ${await r.text()}`);
  return r.json();
}
function badge(run) {
  const v = run.verdicts;  // scored / errored counts (metadata.json): a run is completed only when all were scored
  const kinds = v && v.errored ? Object.entries(v.by_kind || {}).map(([k, n]) => `${n} ${k}`).join(", ") : "";
  const counts = v ? ` <span class="muted verdicts" data-scored="${v.scored}" data-errored="${v.errored}">${v.scored} scored` +
    (v.errored ? `, ${v.errored} errored (${esc(kinds)})` : "") + `</span>` : "";
  return `<span class="badge ${esc(run.status)}" data-status="${esc(run.status)}">${esc(run.display_status || run.status)}</span>${counts}`;
}
function progress(run) {
  const pct = run.total ? Math.min(100, 100 * run.completed / run.total) : (run.status === "completed" ? 100 : 0);
  return `<span class="bar"><i style="width:${pct.toFixed(1)}%"></i></span>${run.completed}/${run.total || "?"}`;
}
function setLive(on) { $live.classList.toggle("off", !on); }
function every(ms, fn) { clearInterval(timer); timer = setInterval(fn, ms); }

// ------------------------------------------------------------------ runs list

const listSort = { key: "started_at", dir: -1 };
const picked = new Set();     // run ids ticked for the compare view
const COLS = [                // [key, label, numeric]
  ["id", "id"], ["name", "name"], ["kind", "kind"], ["env_id", "env"], ["model", "model"], ["status", "status"],
  ["completed", "progress", true], ["avg_reward", "avg reward", true], ["pass1", "pass@1", true],
  ["passk", "pass@k", true], ["scored_rollouts", "scored", true], ["errored_rollouts", "errored", true],
  ["started_at", "started"], ["duration", "duration", true]];
function passKeys(r) { return Object.keys(r.pass_at_k || {}).map(Number).sort((a, b) => a - b); }
function sortValue(r, key) {
  if (key === "pass1") return (r.pass_at_k || {})["1"] ?? null;
  if (key === "passk") { const ks = passKeys(r); return ks.length ? r.pass_at_k[String(ks[ks.length - 1])] : null; }
  return r[key] ?? null;
}
function outputsNote(r) {
  const note = {"deleted": "outputs deleted", "not saved": "results not saved"}[r.outputs];
  return note ? `<span class="muted outputs-note">${note}</span>` : "";
}

async function viewList() {
  const my = gen;
  $view.innerHTML = `
    <h2>Runs</h2>
    <div class="filters">
      <select id="f-status"><option value="">any status</option>
        ${["running", "completed", "incomplete", "failed", "stopped"].map(s => `<option ${filters.status === s ? "selected" : ""}>${s}</option>`).join("")}</select>
      <select id="f-kind"><option value="">any kind</option>
        ${["eval", "swe-debug"].map(s => `<option ${filters.kind === s ? "selected" : ""}>${s}</option>`).join("")}</select>
      <input id="f-env" placeholder="env" value="${esc(filters.env)}">
      <input id="f-model" placeholder="model" value="${esc(filters.model)}">
      <button id="compare-btn" disabled>compare selected</button>
    </div>
    <div id="launch-slot"></div>
    <table id="runs-table"><thead><tr><th></th>
      ${COLS.map(([k, label, num]) => `<th class="sort ${num ? "num" : ""}" data-sort="${k}">${label}<span class="arrow"></span></th>`).join("")}</tr></thead>
      <tbody id="runs-body"><tr><td colspan="${COLS.length + 1}" class="muted">loading…</td></tr></tbody></table>`;
  for (const k of ["status", "kind", "env", "model"]) {
    const el = document.getElementById("f-" + k);
    el.addEventListener(el.tagName === "SELECT" ? "change" : "input", () => { filters[k] = el.value; refresh(); });
  }
  const cmp = document.getElementById("compare-btn");
  const syncCompare = () => { cmp.disabled = picked.size < 2; cmp.textContent = `compare selected (${picked.size})`; };
  cmp.addEventListener("click", () => { location.hash = `#/compare/${[...picked].map(encodeURIComponent).join(",")}`; });
  let runs = [];
  const render = () => {
    document.querySelectorAll("#runs-table th[data-sort]").forEach(th => {
      th.querySelector(".arrow").textContent = th.dataset.sort === listSort.key ? (listSort.dir > 0 ? " ▲" : " ▼") : "";
    });
    const sorted = [...runs].sort((a, b) => {
      const x = sortValue(a, listSort.key), y = sortValue(b, listSort.key);
      if (x === null && y === null) return 0;
      if (x === null) return 1;
      if (y === null) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * listSort.dir;
    });
    const body = document.getElementById("runs-body");
    body.innerHTML = sorted.length ? sorted.map(r => {
      const ks = passKeys(r), kmax = ks.length ? ks[ks.length - 1] : null;
      return `
        <tr class="click" data-run-id="${esc(r.id)}">
          <td><input type="checkbox" class="pick" ${picked.has(r.id) ? "checked" : ""}></td>
          <td class="mono"><a href="#/run/${esc(r.id)}">${esc(r.id)}</a></td><td>${esc(r.name || "")}</td>
          <td>${esc(r.kind)}</td><td>${esc(r.env_id)}</td><td>${esc(r.model || "")}</td>
          <td>${badge(r)} ${outputsNote(r)}${r.failure_category ? `<div class="muted failure-category">${esc(r.failure_category)}</div>` : ""}</td>
          <td>${progress(r)}</td>
          <td class="num avg-reward">${fmt(r.avg_reward)}</td>
          <td class="num pass1">${fmt((r.pass_at_k || {})["1"])}</td>
          <td class="num passk">${kmax === null ? "–" : `${fmt(r.pass_at_k[String(kmax)])} <span class="muted">@${kmax}</span>`}</td>
          <td class="num scored">${r.scored_rollouts ?? 0}</td>
          <td class="num errored" title="${esc(Object.entries(r.errors_by_kind || {}).map(([k, n]) => `${k} ${n}`).join(", "))}">${r.errored_rollouts ?? 0}${Object.keys(r.errors_by_kind || {}).length ? ` <span class="muted by-kind">(${esc(Object.entries(r.errors_by_kind).map(([k, n]) => `${k} ${n}`).join(", "))})</span>` : ""}</td>
          <td>${when(r.started_at)}</td><td class="num">${dur(r.duration)}</td></tr>`;
    }).join("") : `<tr><td colspan="${COLS.length + 1}" class="muted">no runs</td></tr>`;
    body.querySelectorAll("tr[data-run-id]").forEach(tr => {
      const box = tr.querySelector("input.pick");
      box.addEventListener("click", ev => {
        ev.stopPropagation();
        if (box.checked) picked.add(tr.dataset.runId); else picked.delete(tr.dataset.runId);
        syncCompare();
      });
      tr.addEventListener("click", () => { location.hash = `#/run/${tr.dataset.runId}`; });
    });
    syncCompare();
  };
  document.querySelectorAll("#runs-table th[data-sort]").forEach(th => th.addEventListener("click", () => {
    if (listSort.key === th.dataset.sort) listSort.dir = -listSort.dir;
    else { listSort.key = th.dataset.sort; listSort.dir = -1; }
    render();
  }));
  const refresh = async () => {
    if (my !== gen) return;
    const qs = new URLSearchParams(Object.entries(filters).filter(([, v]) => v));
    try {
      const got = await api(`/api/runs?${qs}`);
      if (my !== gen) return;
      setLive(true);
      runs = got;
      render();
    } catch (e) { setLive(false); }
  };
  await refresh();
  every(2000, refresh);
  launchForm(my);
}

// --------------------------------------------------------------- compare view

const PALETTE = ["#7c8cff", "#3fb97a", "#e5534b", "#d6a53a", "#4aa3ff", "#c678dd"];

async function viewCompare(ids) {
  const my = gen;
  let data;
  try { data = await Promise.all(ids.map(id => api(`/api/runs/${encodeURIComponent(id)}`))); }
  catch (e) { $view.innerHTML = `<p><a href="#/">← runs</a></p><div class="error-box">${esc(e.message)}</div>`; return; }
  if (my !== gen) return;
  const ks = [...new Set(data.flatMap(d => Object.keys((d.summary || {}).pass_at_k || {})))].sort((a, b) => a - b);
  const metricNames = [...new Set(data.flatMap(d => Object.keys((d.summary || {}).metrics || {})))].sort();
  const rows = [
    ["env", d => esc(d.run.env_id)], ["model", d => esc(d.run.model || "–")], ["status", d => badge(d.run)],
    ["examples × rollouts", d => `${d.summary.n_examples ?? "–"} × ${d.run.args.rollouts_per_example ?? "–"}`],
    ["rollouts", d => d.summary.n_rollouts ?? "–"],
    ["avg reward", d => `<b class="cmp-avg">${fmt((d.summary.reward || {}).mean)}</b>`],
    ["reward std", d => fmt((d.summary.reward || {}).std)],
    ...ks.map(k => [`pass@${k}`, d => fmt(((d.summary.pass_at_k) || {})[k])]),
    ["errored", d => d.summary.n_rollouts ? `${(100 * d.summary.error_rate).toFixed(1)}%` : "–"],
    ...metricNames.map(m => [m, d => fmt((((d.summary.metrics) || {})[m] || {}).mean)]),
    ["sampling args", d => `<span class="mono">${esc(JSON.stringify(d.run.args.sampling_args || {}))}</span>`],
    ["env args", d => `<span class="mono">${esc(JSON.stringify(d.run.args.env_args || {}))}</span>`],
  ];
  $view.innerHTML = `
    <p><a href="#/">← runs</a></p><h2>Compare ${data.length} runs</h2>
    <table id="compare-table"><thead><tr><th></th>${data.map((d, i) => `<th data-run-id="${esc(d.run.id)}">
        <span class="swatch" style="background:${PALETTE[i % PALETTE.length]}"></span>
        <a href="#/run/${esc(d.run.id)}">${esc(d.run.name || d.run.env_id)}</a> <span class="muted mono">${esc(d.run.id)}</span></th>`).join("")}</tr></thead>
      <tbody>${rows.map(([label, f]) => `<tr><td class="muted">${esc(label)}</td>${data.map(d => `<td>${f(d)}</td>`).join("")}</tr>`).join("")}</tbody></table>
    <h3>Reward histograms (share of rollouts per bin, overlaid)</h3>
    <div id="compare-hist">${overlaidHistogram(data)}</div>`;
}

function overlaidHistogram(data) {
  const W = 560, H = 180, pad = 24;
  const hs = data.map(d => (d.summary || {}).histogram || {edges: [], counts: []});
  const lo = Math.min(...hs.filter(h => h.edges.length).map(h => h.edges[0]), 0);
  const hi = Math.max(...hs.filter(h => h.edges.length).map(h => h.edges[h.edges.length - 1]), 1);
  const x = v => pad + (W - 2 * pad) * (v - lo) / ((hi - lo) || 1);
  const y = f => H - pad - (H - 2 * pad) * f;
  let svg = `<svg width="${W}" height="${H}" class="hist-svg"><line x1="${pad}" y1="${H - pad}" x2="${W - pad}" y2="${H - pad}" stroke="#2a3039"/>`;
  hs.forEach((h, i) => {
    const n = h.counts.reduce((a, b) => a + b, 0) || 1;
    h.counts.forEach((c, b) => {
      if (!c) return;
      const x0 = x(h.edges[b]), x1 = x(h.edges[b + 1]);
      svg += `<rect class="hist-bar" data-run="${i}" x="${x0.toFixed(1)}" y="${y(c / n).toFixed(1)}" width="${Math.max(1, x1 - x0 - 1).toFixed(1)}"
        height="${(H - pad - y(c / n)).toFixed(1)}" fill="${PALETTE[i % PALETTE.length]}" fill-opacity="0.45"
        stroke="${PALETTE[i % PALETTE.length]}"><title>${c} of ${n}</title></rect>`;
    });
  });
  svg += `<text x="${pad}" y="${H - 6}" fill="#8b96a3" font-size="11">${fmt(lo, 2)}</text>
    <text x="${W - pad}" y="${H - 6}" fill="#8b96a3" font-size="11" text-anchor="end">${fmt(hi, 2)}</text></svg>`;
  return svg;
}

async function launchForm(my) {
  let info;
  try { info = await api("/api/endpoints"); } catch (e) { return; }
  if (my !== gen || !info.allow_launch) return;
  const slot = document.getElementById("launch-slot");
  slot.innerHTML = `<details><summary>Start a run</summary><form class="launch" id="launch">
      <input name="env" placeholder="env id" required>
      <select name="endpoint"><option value="">model: default</option>
        ${info.endpoints.map(e => `<option value="${esc(e.endpoint_id)}">${esc(e.endpoint_id)} (${esc(e.model || "")})</option>`).join("")}</select>
      <input name="n" type="number" min="1" placeholder="n" style="width:70px">
      <input name="r" type="number" min="1" placeholder="r" style="width:70px">
      <input name="env_args" placeholder='env args JSON, e.g. {"split":"test"}' style="width:260px">
      <input name="name" placeholder="name (optional)">
      <button type="submit">Start</button><span id="launch-msg" class="muted"></span></form></details>`;
  document.getElementById("launch").addEventListener("submit", async ev => {
    ev.preventDefault();
    const body = Object.fromEntries(new FormData(ev.target).entries());
    const msg = document.getElementById("launch-msg");
    msg.textContent = "starting…";
    try {
      const r = await fetch("/api/launch", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
      const j = await r.json();
      if (j.ok) location.hash = `#/run/${j.run_id}`;
      else msg.textContent = `failed: ${j.error}${j.console ? "\n" + j.console : ""}`;
    } catch (e) { msg.textContent = `failed: ${e}`; }
  });
}

// -------------------------------------------------------------------- one run

async function viewRun(id, tab, sub) {
  const my = gen;
  let data;
  try { data = await api(`/api/runs/${encodeURIComponent(id)}`); }
  catch (e) { $view.innerHTML = `<p><a href="#/">← runs</a></p><div class="error-box">${esc(e.message)}</div>`; return; }
  if (my !== gen) return;
  const run = data.run;
  const swe = run.kind === "swe-debug";
  const tabs = swe ? ["instances", "log"] : ["metrics", "samples", "log"];
  if (!tabs.includes(tab)) tab = run.status === "failed" ? "log" : tabs[0];
  $view.innerHTML = `
    <p><a href="#/">← runs</a></p>
    <div id="run-head"></div>
    <div class="tabs">${tabs.map(t => `<a href="#/run/${esc(run.id)}/${t}" class="${t === tab ? "on" : ""}" data-tab="${t}">${t}</a>`).join("")}</div>
    <div id="tab"></div>`;
  const head = d => {
    const r = d.run;
    document.getElementById("run-head").innerHTML = `
      <h2>${esc(r.name || r.env_id)} <span class="muted mono">${esc(r.id)}</span> ${badge(r)}
        ${r.status === "running" ? `<button class="danger" id="stop-btn">Stop</button>` : ""}</h2>
      <div class="kv">
        <div>kind</div><div>${esc(r.kind)}</div><div>env</div><div>${esc(r.env_id)}</div>
        <div>model</div><div>${esc(r.model || "–")}</div><div>progress</div><div>${progress(r)} (${r.scored_rollouts ?? 0} scored, ${r.errored_rollouts ?? 0} errored)</div>
        <div>started</div><div>${when(r.started_at)}${r.status === "running" ? ` <span class="muted">(last update ${dur(Date.now() / 1000 - r.updated_at)} ago)</span>` : ""}</div><div>duration</div><div>${dur(r.duration)}${r.attempts > 1 ? ` (resumed ${r.attempts - 1}×)` : ""}</div>
        <div>output</div><div class="mono" id="outputs">${esc(r.output_dir)} <span class="muted">(${esc(r.outputs)})</span></div>
      </div>
      <details id="config"><summary>config</summary><pre class="log">${esc(JSON.stringify(r.args, null, 2))}</pre></details>
      ${r.error ? `<div class="error-box" id="error-box">${esc(r.error)}</div>` : ""}
      ${d.diagnosis ? `<div class="diagnosis" id="diagnosis"><b class="category">${esc(d.diagnosis.category)}</b>
        <span class="hint">next: ${esc(d.diagnosis.hint)}</span></div>` : ""}`;
    const b = document.getElementById("stop-btn");
    if (b) b.addEventListener("click", async () => {
      b.disabled = true; b.textContent = "stopping…";
      await fetch(`/api/runs/${encodeURIComponent(r.id)}/stop`, {method: "POST", headers: {"Content-Type": "application/json"}, body: "{}"});
    });
  };
  head(data);
  const el = document.getElementById("tab");
  let wasRunning = run.status === "running";
  if (tab === "metrics") renderMetrics(el, data.summary, run);
  if (tab === "samples") await renderSamples(el, run.id, sub, my);
  if (tab === "instances") await renderInstances(el, run.id, data.summary, my);
  let logState = null;
  if (tab === "log") logState = await renderLog(el, run.id, my);
  setLive(wasRunning);
  every(2000, async () => {
    if (my !== gen) return;
    if (logState) await logState.poll();
    if (!wasRunning) return;
    const d = await api(`/api/runs/${encodeURIComponent(id)}`).catch(() => null);
    if (!d || my !== gen) return;
    head(d);
    wasRunning = d.run.status === "running";
    setLive(wasRunning);
    if (tab === "metrics") renderMetrics(el, d.summary, d.run);
    if (tab === "instances") await renderInstances(el, run.id, d.summary, my);
  });
}

function noResults(run) {
  return {"not saved": `${run.status}, results not saved (the eval ran without -s)`,
          "deleted": `${run.status}, outputs deleted (${run.output_dir} is gone)`}[run.outputs]
    || (run.status === "running" ? "no results yet" : `${run.status}, no results`);
}

// The parameters that define what was evaluated, plainly; client internals apart.
function paramsTable(run, s) {
  const a = run.args || {}, m = (s && s.metadata) || {};
  const cc = a.client_config || {};
  const rows = [
    ["model", run.model || a.model], ["endpoint", cc.api_base_url], ["sampling args", a.sampling_args ?? m.sampling_args],
    ["env", run.env_id], ["env args", a.env_args ?? m.env_args], ["n (examples)", m.num_examples ?? a.num_examples],
    ["r (rollouts per example)", a.rollouts_per_example ?? m.rollouts_per_example],
    ["concurrency (-c)", a.max_concurrent], ["backend", a.backend], ["rollout retries (--max-retries)", a.max_retries],
  ].filter(([, v]) => v !== undefined && v !== null);
  const show = v => typeof v === "object" ? JSON.stringify(v) : String(v);
  const asked = m.num_examples_requested ? ` <span class="muted">(asked -n ${esc(m.num_examples_requested)}; the dataset has ${esc(m.num_examples)})</span>` : "";
  return `<h3>Parameters</h3><table id="params"><tbody>${rows.map(([k, v]) =>
      `<tr><td class="muted">${esc(k)}</td><td class="mono">${esc(show(v))}${k === "n (examples)" ? asked : ""}</td></tr>`).join("")}</tbody></table>
    ${Object.keys(cc).length ? `<details id="client-internals"><summary>client internals</summary><pre class="log">${esc(JSON.stringify(cc, null, 2))}</pre></details>` : ""}`;
}

function renderMetrics(el, s, run) {
  if (!s || !s.n_rollouts) { el.innerHTML = `<p class="muted" id="no-results">${esc(noResults(run))}</p>${paramsTable(run, s)}`; return; }
  const r = s.reward;
  const metricRows = Object.entries(s.metrics).map(([k, m]) =>
    `<tr><td>${esc(k)}</td><td class="num">${fmt(m.mean)}</td><td class="num">${fmt(m.std)}</td><td class="num">${fmt(m.min)}</td><td class="num">${fmt(m.max)}</td></tr>`).join("");
  const ks = Object.keys(s.pass_at_k || {});
  const errs = Object.entries(s.errors_by_type || {}).sort((a, b) => b[1] - a[1]);
  const timing = Object.entries(s.timing || {});
  const h = s.histogram, top = Math.max(1, ...h.counts);
  el.innerHTML = `
    <div class="cards" id="metric-cards">
      <div class="card"><b id="avg-reward">${fmt(r.mean)}</b><span>avg reward</span></div>
      <div class="card"><b>${fmt(r.std)}</b><span>std</span></div>
      <div class="card"><b>${s.n_rollouts}</b><span>rollouts</span></div>
      <div class="card"><b>${s.n_examples}</b><span>examples</span></div>
      <div class="card"><b>${(100 * s.error_rate).toFixed(1)}%</b><span>errored</span></div>
    </div>
    ${paramsTable(run, s)}
    <h3>Reward and metrics</h3>
    <table><thead><tr><th>name</th><th class="num">mean</th><th class="num">std</th><th class="num">min</th><th class="num">max</th></tr></thead>
      <tbody><tr><td><b>reward</b></td><td class="num">${fmt(r.mean)}</td><td class="num">${fmt(r.std)}</td><td class="num">${fmt(r.min)}</td><td class="num">${fmt(r.max)}</td></tr>${metricRows}</tbody></table>
    <h3>Reward histogram</h3>
    <div class="hist" id="histogram">${h.counts.map(c => `<div style="height:${(100 * c / top).toFixed(1)}%" title="${c}"><span>${c || ""}</span></div>`).join("")}</div>
    <div class="hist-labels"><span>${fmt(h.edges[0], 2)}</span><span>${fmt(h.edges[h.edges.length - 1], 2)}</span></div>
    <h3>pass@k <span class="muted">(reward ≥ ${s.pass_threshold})</span></h3>
    ${ks.length ? `<table id="passk"><thead><tr><th>k</th>${ks.map(k => `<th class="num">${esc(k)}</th>`).join("")}</tr></thead><tbody>
      <tr><td>pass@k</td>${ks.map(k => `<td class="num">${fmt(s.pass_at_k[k])}</td>`).join("")}</tr>
      <tr><td>pass^k (all k)</td>${ks.map(k => `<td class="num">${fmt(s.pass_all_k[k])}</td>`).join("")}</tr></tbody></table>` : `<p class="muted">–</p>`}
    <h3>Errors by type</h3>
    ${errs.length ? `<table id="errors-by-type"><tbody>${errs.map(([t, n]) => `<tr><td class="mono">${esc(t)}</td><td class="num">${n}</td></tr>`).join("")}</tbody></table>` : `<p class="muted">none</p>`}
    ${Object.keys(s.errors_by_kind || {}).some(k => k !== "unknown") ? `<p class="muted">by kind: ${Object.entries(s.errors_by_kind).map(([k, n]) => `${esc(k)} ${n}`).join(" · ")}</p>` : ""}
    ${Object.keys(s.avg_token_usage || {}).length ? `<h3>Avg token usage per rollout</h3><p class="mono">${Object.entries(s.avg_token_usage).map(([k, v]) => `${esc(k)} ${fmt(v, 1)}`).join(" · ")}</p>` : ""}
    <h3>Timing (seconds)</h3>
    ${timing.length ? `<table id="timing"><thead><tr><th>phase</th><th class="num">mean</th><th class="num">p50</th><th class="num">p90</th><th class="num">p99</th><th class="num">max</th></tr></thead><tbody>
      ${timing.map(([k, p]) => `<tr><td>${esc(k)}</td><td class="num">${fmt(p.mean, 2)}</td><td class="num">${fmt(p.p50, 2)}</td><td class="num">${fmt(p.p90, 2)}</td><td class="num">${fmt(p.p99, 2)}</td><td class="num">${fmt(p.max, 2)}</td></tr>`).join("")}</tbody></table>` : `<p class="muted">no timing recorded</p>`}`;
}

function content(c) {
  if (c === null || c === undefined) return "";
  if (typeof c === "string") return c;
  if (Array.isArray(c)) return c.map(p => (p && (p.text ?? (p.type === "tool_use" ? `[tool_use ${p.name}] ${JSON.stringify(p.input)}` : JSON.stringify(p))))).join("\n");
  return JSON.stringify(c, null, 1);
}
function messages(m) {
  if (m === null || m === undefined) return `<span class="muted">–</span>`;
  if (!Array.isArray(m)) return `<div class="msg">${esc(content(m))}</div>`;
  return m.map(x => {
    if (!x || typeof x !== "object") return `<div class="msg">${esc(x)}</div>`;
    let body = content(x.content);
    for (const tc of x.tool_calls || []) {
      const fn = tc.function || tc;
      body += `${body ? "\n" : ""}→ ${fn.name}(${typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments ?? {})})`;
    }
    return `<div class="msg"><span class="role">${esc(x.role || "")}</span>${esc(body)}</div>`;
  }).join("");
}

const sampleState = { q: "", show: "all", sort: "example", dir: 1, collapsed: new Set() };
const SAMPLE_COLS = [["example", "example"], ["rollout", "rollout"], ["reward", "reward", true], ["metrics", "metrics"],
  ["error", "error"], ["turns", "turns", true], ["tokens", "tokens", true], ["duration", "duration (s)", true]];

async function renderSamples(el, id, sub, my) {
  const d = await api(`/api/runs/${encodeURIComponent(id)}/rows`);
  if (my !== gen) return;
  if (!d.rows.length) {
    const r = await api(`/api/runs/${encodeURIComponent(id)}`).catch(() => null);
    el.innerHTML = `<p class="muted" id="no-results">${esc(r ? noResults(r.run) : "no samples yet")}</p>`;
    return;
  }
  el.innerHTML = `
    <div class="filters">
      <input id="sample-search" placeholder="search prompt, completion, error…" value="${esc(sampleState.q)}" style="width:280px">
      <select id="sample-show">${[["all", "all rollouts"], ["errors", "errors only"], ["pass", "reward > 0"], ["zero", "reward = 0"]]
        .map(([v, l]) => `<option value="${v}" ${sampleState.show === v ? "selected" : ""}>${l}</option>`).join("")}</select>
      <button id="collapse-all">collapse all</button><button id="expand-all">expand all</button>
      <span class="muted" id="sample-count"></span>
      <span class="muted">total tokens: <b id="total-tokens">${fmt(d.total_tokens, 0)}</b></span>
    </div>
    <div id="sample-detail"></div>
    <table id="samples-table"><thead><tr>${SAMPLE_COLS.map(([k, l, num]) =>
      `<th class="sort ${num ? "num" : ""}" data-sort="${k}">${l}<span class="arrow"></span></th>`).join("")}<th></th></tr></thead></table>`;
  const table = document.getElementById("samples-table");
  const groups = new Map();
  for (const r of d.rows) {
    const k = String(r.example_id);
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(r);
  }
  const mean = rs => rs.reduce((a, r) => a + (r.reward ?? 0), 0) / (rs.length || 1);
  const std = rs => { const m = mean(rs); return Math.sqrt(rs.reduce((a, r) => a + ((r.reward ?? 0) - m) ** 2, 0) / (rs.length || 1)); };
  const matches = r => {
    if (sampleState.show === "errors" && !r.error) return false;
    if (sampleState.show === "pass" && !(r.reward > 0)) return false;
    if (sampleState.show === "zero" && (r.reward ?? 0) !== 0) return false;
    const q = sampleState.q.trim().toLowerCase();
    if (!q) return true;
    return [r.prompt_preview, r.completion_preview, r.error, String(r.example_id), JSON.stringify(r.metrics)]
      .some(t => t && String(t).toLowerCase().includes(q));
  };
  const metricText = m => Object.entries(m || {}).map(([k, v]) => `${esc(k)}=${typeof v === "number" ? fmt(v) : esc(v)}`).join(" ");
  const rowHtml = r => `<tr class="sample ${r.error ? "fail" : (r.reward > 0 ? "pass" : "zero")}" data-idx="${r.idx}" data-example-id="${esc(r.example_id)}" data-rollout="${r.rollout}">
      <td class="mono">${esc(r.example_id)}</td><td>#${r.rollout + 1}</td>
      <td class="num sample-reward">${fmt(r.reward)}</td><td class="spread">${metricText(r.metrics)}</td>
      <td class="sample-error">${r.error ? `<span class="err">${esc(r.error.slice(0, 140))}</span>` : ""}</td>
      <td class="num">${r.turns}</td><td class="num">${fmt(r.tokens, 0)}</td><td class="num">${fmt(r.duration, 2)}</td>
      <td><a class="sample-link" href="#/run/${esc(id)}/samples/${r.idx}" title="link to this sample">#</a></td></tr>`;
  const render = () => {
    table.querySelectorAll("th[data-sort]").forEach(th => {
      th.querySelector(".arrow").textContent = th.dataset.sort === sampleState.sort ? (sampleState.dir > 0 ? " ▲" : " ▼") : "";
    });
    table.querySelectorAll("tbody").forEach(b => b.remove());
    let shown = 0;
    if (sampleState.sort === "example") {  // grouped, in example order
      const keys = [...groups.keys()];
      if (sampleState.dir < 0) keys.reverse();
      for (const k of keys) {
        const all = groups.get(k), rs = all.filter(matches);
        if (!rs.length) continue;
        shown += rs.length;
        const closed = sampleState.collapsed.has(k);
        const tb = document.createElement("tbody");
        tb.className = "group" + (closed ? " collapsed" : "");
        tb.dataset.exampleId = k;
        tb.innerHTML = `<tr class="group-head"><td colspan="${SAMPLE_COLS.length + 1}">
            <span class="toggle">${closed ? "▸" : "▾"}</span> <b>example ${esc(k)}</b>
            <span class="spread">${esc((all[0].prompt_preview || "").slice(0, 120))}</span>
            <span>group mean <b class="group-mean">${fmt(mean(all))}</b> <span class="spread">± ${fmt(std(all))} · ${all.length} rollouts</span></span></td></tr>`
          + rs.map(rowHtml).join("");
        table.appendChild(tb);
      }
    } else {
      const key = sampleState.sort;
      const val = r => key === "metrics" ? Object.values(r.metrics || {})[0] ?? null : key === "error" ? (r.error || "") : r[key];
      const rs = d.rows.filter(matches).sort((a, b) => {
        const x = val(a), y = val(b);
        return ((x ?? -Infinity) < (y ?? -Infinity) ? -1 : (x ?? -Infinity) > (y ?? -Infinity) ? 1 : a.idx - b.idx) * sampleState.dir;
      });
      shown = rs.length;
      const tb = document.createElement("tbody");
      tb.className = "flat";
      tb.innerHTML = rs.map(rowHtml).join("");
      table.appendChild(tb);
    }
    document.getElementById("sample-count").textContent = `${shown} of ${d.rows.length} rollouts · ${groups.size} examples`;
    table.querySelectorAll("tr.group-head").forEach(tr => tr.addEventListener("click", () => {
      const k = tr.parentElement.dataset.exampleId;
      if (sampleState.collapsed.has(k)) sampleState.collapsed.delete(k); else sampleState.collapsed.add(k);
      render();
    }));
    table.querySelectorAll("tr.sample").forEach(tr => tr.addEventListener("click", ev => {
      if (ev.target.closest("a")) return;
      location.hash = `#/run/${id}/samples/${tr.dataset.idx}`;
    }));
    if (sub !== undefined) table.querySelector(`tr.sample[data-idx="${CSS.escape(String(sub))}"]`)?.classList.add("selected");
  };
  table.querySelectorAll("th[data-sort]").forEach(th => th.addEventListener("click", () => {
    if (sampleState.sort === th.dataset.sort) sampleState.dir = -sampleState.dir;
    else { sampleState.sort = th.dataset.sort; sampleState.dir = th.dataset.sort === "example" ? 1 : -1; }
    render();
  }));
  document.getElementById("sample-search").addEventListener("input", ev => { sampleState.q = ev.target.value; render(); });
  document.getElementById("sample-show").addEventListener("change", ev => { sampleState.show = ev.target.value; render(); });
  document.getElementById("collapse-all").addEventListener("click", () => { groups.forEach((_, k) => sampleState.collapsed.add(k)); render(); });
  document.getElementById("expand-all").addEventListener("click", () => { sampleState.collapsed.clear(); render(); });
  render();
  if (sub !== undefined) await renderSampleDetail(document.getElementById("sample-detail"), id, sub, my);
}

async function renderSampleDetail(el, id, idx, my) {
  let d;
  try { d = await api(`/api/runs/${encodeURIComponent(id)}/rows/${encodeURIComponent(idx)}`); }
  catch (e) { el.innerHTML = `<div class="error-box">${esc(e.message)}</div>`; return; }
  if (my !== gen) return;
  const r = d.row, info = d.error_info;
  el.innerHTML = `<div class="sample-detail" data-idx="${d.idx}">
      <div class="group-head"><b>example ${esc(r.example_id)}</b> <span>reward <b id="detail-reward">${fmt(r.reward)}</b></span>
        <span class="spread">tokens ${fmt(d.tokens, 0)} · attempts ${esc(r.attempts ?? 1)}</span>
        <a href="#/run/${esc(id)}/samples">close</a></div>
      ${info ? `<div class="error-box" id="detail-error">${esc(info.type)}: ${esc(info.message)}${info.kind ? ` <span class="muted">(${esc(info.kind)})</span>` : ""}</div>
        ${info.traceback ? `<details open><summary>traceback</summary><pre class="log" id="detail-traceback">${esc(info.traceback)}</pre></details>` : ""}`
        : (r.error ? `<div class="error-box" id="detail-error">${esc(typeof r.error === "string" ? r.error : JSON.stringify(r.error))}</div>` : "")}
      <details open><summary>prompt</summary>${messages(r.prompt)}</details>
      <details open><summary>completion</summary>${messages(r.completion)}</details>
      <h3>Per-turn timing (seconds)</h3>
      ${d.turn_timing.length ? `<table id="turn-timing"><thead><tr><th>turn</th><th class="num">model</th><th class="num">environment</th></tr></thead><tbody>
        ${d.turn_timing.map(t => `<tr><td>${t.turn}</td><td class="num">${fmt(t.model_s, 3)}</td><td class="num">${fmt(t.env_s, 3)}</td></tr>`).join("")}</tbody></table>`
        : `<p class="muted">no per-turn timing recorded</p>`}
      <details id="raw-json"><summary>raw row (JSON)</summary><pre class="log">${esc(JSON.stringify(r, null, 2))}</pre></details>
    </div>`;
  el.scrollIntoView({block: "start"});
}

async function renderInstances(el, id, s, my) {
  const d = await api(`/api/runs/${encodeURIComponent(id)}/instances`);
  if (my !== gen) return;
  const open = new Set([...el.querySelectorAll("details[open][data-iid]")].map(x => x.dataset.iid));
  const phases = [...new Set(d.instances.flatMap(i => Object.keys(i.timings || {})))];
  const reasons = Object.entries(s.reasons || {}).sort((a, b) => b[1] - a[1]);
  el.innerHTML = `
    <div class="cards"><div class="card"><b>${s.n || 0}</b><span>instances</span></div>
      <div class="card"><b>${s.valid || 0}</b><span>valid</span></div>
      ${reasons.map(([k, n]) => `<div class="card"><b>${n}</b><span>${esc(k)}</span></div>`).join("")}</div>
    <h3>Instances</h3>
    <table id="instances"><thead><tr><th>instance</th><th>reason</th><th>valid</th><th>detail</th>${phases.map(p => `<th class="num">${esc(p)} (s)</th>`).join("")}</tr></thead>
    <tbody>${d.instances.map(i => `
      <tr data-instance-id="${esc(i.instance_id)}"><td class="mono">${esc(i.instance_id)}</td><td>${esc(i.reason ?? "–")}</td>
        <td>${i.valid === true ? "✔" : i.valid === false ? "✘" : "–"}</td>
        <td class="spread">${esc((i.detail || "").slice(0, 160))}</td>
        ${phases.map(p => `<td class="num">${fmt(i.timings[p], 2)}</td>`).join("")}</tr>
      <tr><td colspan="${4 + phases.length}"><details data-iid="${esc(i.instance_id)}" ${open.has(String(i.instance_id)) ? "open" : ""}><summary>test log tail</summary>
        ${i.error ? `<div class="error-box">${esc(i.error)}</div>` : ""}
        ${i.detail ? `<div class="mono">${esc(i.detail)}</div>` : ""}
        ${[["FAIL_TO_PASS", i.fail_to_pass], ["PASS_TO_PASS", i.pass_to_pass]].filter(([, g]) => g).map(([n, g]) =>
          `<div class="spread">${n}: ${g.passed ?? 0} passed${(g.failing || []).length ? `, failing: ${esc(g.failing.join(", "))}` : ""}${(g.missing || []).length ? `, missing: ${esc(g.missing.join(", "))}` : ""}</div>`).join("")}
        ${i.step || i.test_exit_code !== null && i.test_exit_code !== undefined ? `<div class="spread">step ${esc(i.step ?? "–")} · test exit ${esc(i.test_exit_code ?? "–")}</div>` : ""}
        <pre class="log">${esc(i.stdout_tail || "")}${i.stderr_tail ? "\n--- stderr ---\n" + esc(i.stderr_tail) : ""}</pre></details></td></tr>`).join("")}
    </tbody></table>
    <h3>Phase timings (seconds)</h3>
    <table><thead><tr><th>phase</th><th class="num">p50</th><th class="num">p90</th><th class="num">max</th></tr></thead><tbody>
      ${Object.entries(s.phase_timings || {}).map(([k, p]) => `<tr><td>${esc(k)}</td><td class="num">${fmt(p.p50, 2)}</td><td class="num">${fmt(p.p90, 2)}</td><td class="num">${fmt(p.max, 2)}</td></tr>`).join("")}</tbody></table>`;
}

async function renderLog(el, id, my) {
  el.innerHTML = `<div class="filters">
      <input id="log-search" placeholder="search the log (shows matching lines)" style="width:320px">
      <label><input type="checkbox" id="log-follow" checked> follow the tail</label>
      <span class="muted" id="log-note"></span></div>
    <pre class="log" id="log"></pre>`;
  const pre = document.getElementById("log");
  const search = document.getElementById("log-search");
  const follow = document.getElementById("log-follow");
  const note = document.getElementById("log-note");
  let offset = null, text = "", truncated = false;
  const render = () => {
    const q = search.value.trim().toLowerCase();
    if (!q) {
      pre.textContent = text;
      note.textContent = truncated ? "showing the end of the log" : "";
    } else {
      const lines = text.split("\n").filter(l => l.toLowerCase().includes(q));
      pre.innerHTML = lines.map(l => {
        const i = l.toLowerCase().indexOf(q);
        return `${esc(l.slice(0, i))}<mark>${esc(l.slice(i, i + q.length))}</mark>${esc(l.slice(i + q.length))}`;
      }).join("\n");
      note.textContent = `${lines.length} matching line(s)`;
    }
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  };
  search.addEventListener("input", render);
  follow.addEventListener("change", render);
  pre.addEventListener("scroll", () => {  // scrolling up stops following; back to the bottom resumes
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
    if (follow.checked !== atBottom && document.activeElement !== follow) follow.checked = atBottom;
  });
  const poll = async () => {
    const d = await api(`/api/runs/${encodeURIComponent(id)}/log${offset === null ? "" : `?offset=${offset}`}`).catch(() => null);
    if (!d || my !== gen) return;
    if (offset === null) truncated = d.truncated;
    offset = d.offset;
    if (d.text) { text += d.text; render(); }
  };
  await poll();
  render();
  return { poll };
}

// --------------------------------------------------------------------- router

function route() {
  gen++;
  clearInterval(timer);
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "run" && parts[1]) viewRun(parts[1], parts[2], parts[3]);
  else if (parts[0] === "compare" && parts[1]) viewCompare(parts[1].split(",").filter(Boolean));
  else viewList();
}
window.addEventListener("hashchange", route);
route();

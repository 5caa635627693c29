// vf-sandbox dashboard: a hash-routed single page over the JSON API in dashboard.py.
// #/                     runs list (live)
// #/run/ID[/TAB]         one run: metrics | samples | instances | log
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
  return `<span class="badge ${esc(run.status)}" data-status="${esc(run.status)}">${esc(run.display_status || run.status)}</span>`;
}
function progress(run) {
  const pct = run.total ? Math.min(100, 100 * run.completed / run.total) : (run.status === "completed" ? 100 : 0);
  return `<span class="bar"><i style="width:${pct.toFixed(1)}%"></i></span>${run.completed}/${run.total || "?"}`;
}
function setLive(on) { $live.classList.toggle("off", !on); }
function every(ms, fn) { clearInterval(timer); timer = setInterval(fn, ms); }

// ------------------------------------------------------------------ runs list

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
    </div>
    <div id="launch-slot"></div>
    <table id="runs-table"><thead><tr>
      <th>id</th><th>name</th><th>kind</th><th>env</th><th>model</th><th>status</th><th>progress</th>
      <th class="num">errors</th><th>started</th><th class="num">duration</th></tr></thead>
      <tbody id="runs-body"><tr><td colspan="10" class="muted">loading…</td></tr></tbody></table>`;
  for (const k of ["status", "kind", "env", "model"]) {
    const el = document.getElementById("f-" + k);
    el.addEventListener(el.tagName === "SELECT" ? "change" : "input", () => { filters[k] = el.value; refresh(); });
  }
  const refresh = async () => {
    if (my !== gen) return;
    const qs = new URLSearchParams(Object.entries(filters).filter(([, v]) => v));
    try {
      const runs = await api(`/api/runs?${qs}`);
      if (my !== gen) return;
      setLive(true);
      const body = document.getElementById("runs-body");
      body.innerHTML = runs.length ? runs.map(r => `
        <tr class="click" data-run-id="${esc(r.id)}">
          <td class="mono"><a href="#/run/${esc(r.id)}">${esc(r.id)}</a></td><td>${esc(r.name || "")}</td>
          <td>${esc(r.kind)}</td><td>${esc(r.env_id)}</td><td>${esc(r.model || "")}</td>
          <td>${badge(r)}</td><td>${progress(r)}</td><td class="num">${r.errors}</td>
          <td>${when(r.started_at)}</td><td class="num">${dur(r.duration)}</td></tr>`).join("")
        : `<tr><td colspan="10" class="muted">no runs</td></tr>`;
      body.querySelectorAll("tr[data-run-id]").forEach(tr =>
        tr.addEventListener("click", () => { location.hash = `#/run/${tr.dataset.runId}`; }));
    } catch (e) { setLive(false); }
  };
  await refresh();
  every(2000, refresh);
  launchForm(my);
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

async function viewRun(id, tab) {
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
        <div>model</div><div>${esc(r.model || "–")}</div><div>progress</div><div>${progress(r)} (${r.errors} errors)</div>
        <div>started</div><div>${when(r.started_at)}${r.status === "running" ? ` <span class="muted">(last update ${dur(Date.now() / 1000 - r.updated_at)} ago)</span>` : ""}</div><div>duration</div><div>${dur(r.duration)}${r.attempts > 1 ? ` (resumed ${r.attempts - 1}×)` : ""}</div>
        <div>output</div><div class="mono">${esc(r.output_dir)}</div>
      </div>
      <details id="config"><summary>config</summary><pre class="log">${esc(JSON.stringify(r.args, null, 2))}</pre></details>
      ${r.error ? `<div class="error-box" id="error-box">${esc(r.error)}</div>` : ""}`;
    const b = document.getElementById("stop-btn");
    if (b) b.addEventListener("click", async () => {
      b.disabled = true; b.textContent = "stopping…";
      await fetch(`/api/runs/${encodeURIComponent(r.id)}/stop`, {method: "POST", headers: {"Content-Type": "application/json"}, body: "{}"});
    });
  };
  head(data);
  const el = document.getElementById("tab");
  let wasRunning = run.status === "running";
  if (tab === "metrics") renderMetrics(el, data.summary);
  if (tab === "samples") await renderSamples(el, run.id, 0, my);
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
    if (tab === "metrics") renderMetrics(el, d.summary);
    if (tab === "instances") await renderInstances(el, run.id, d.summary, my);
  });
}

function renderMetrics(el, s) {
  if (!s || !s.n_rollouts) { el.innerHTML = `<p class="muted">no results yet</p>`; return; }
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

async function renderSamples(el, id, offset, my) {
  const limit = 10;
  const d = await api(`/api/runs/${encodeURIComponent(id)}/samples?offset=${offset}&limit=${limit}`);
  if (my !== gen) return;
  if (!d.total_groups) { el.innerHTML = `<p class="muted">no samples yet</p>`; return; }
  const pager = `<div class="pager">
      <button ${offset <= 0 ? "disabled" : ""} data-go="${Math.max(0, offset - limit)}">← prev</button>
      <span class="muted">examples ${offset + 1}–${Math.min(offset + limit, d.total_groups)} of ${d.total_groups}</span>
      <button ${offset + limit >= d.total_groups ? "disabled" : ""} data-go="${offset + limit}">next →</button></div>`;
  el.innerHTML = pager + d.groups.map(g => `
    <div class="group" data-example-id="${esc(g.example_id)}">
      <div class="group-head"><b>example ${esc(g.example_id)}</b>
        <span>reward <b>${fmt(g.reward.mean)}</b> <span class="spread">± ${fmt(g.reward.std)} · min ${fmt(g.reward.min)} · max ${fmt(g.reward.max)} · ${g.rollouts.length} rollouts</span></span>
        ${g.answer !== undefined && g.answer !== null ? `<span class="muted">answer: <span class="mono">${esc(g.answer)}</span></span>` : ""}</div>
      <details open><summary>prompt</summary>${messages(g.prompt)}</details>
      <div class="rollouts">${g.rollouts.map((r, i) => `
        <div class="rollout ${r.error ? "fail" : (r.reward > 0 ? "pass" : "fail")}">
          <div><b>#${i + 1}</b> reward <b class="rollout-reward">${fmt(r.reward)}</b>
            ${Object.entries(r.metrics || {}).map(([k, v]) => `<span class="spread">${esc(k)}=${typeof v === "number" ? fmt(v) : esc(v)}</span>`).join(" ")}</div>
          ${r.tools.length ? `<div>tools: ${r.tools.map(t => `<span class="tool">${esc(t)}</span>`).join("")}</div>` : ""}
          ${r.error ? `<div class="error-box rollout-error">${esc(r.error)}</div>` : ""}
          ${r.timing && r.timing.total !== undefined ? `<div class="spread">total ${fmt(r.timing.total, 2)}s</div>` : ""}
          <details open><summary>completion</summary>${messages(r.completion)}</details>
        </div>`).join("")}</div>
    </div>`).join("") + pager;
  el.querySelectorAll("button[data-go]").forEach(b =>
    b.addEventListener("click", () => renderSamples(el, id, Number(b.dataset.go), my)));
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
  el.innerHTML = `<div class="muted" id="log-note"></div><pre class="log" id="log"></pre>`;
  const pre = document.getElementById("log");
  let offset = null;
  const poll = async () => {
    const d = await api(`/api/runs/${encodeURIComponent(id)}/log${offset === null ? "" : `?offset=${offset}`}`).catch(() => null);
    if (!d || my !== gen) return;
    if (offset === null && d.truncated) document.getElementById("log-note").textContent = "showing the end of the log";
    const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
    if (d.text) pre.appendChild(document.createTextNode(d.text));
    offset = d.offset;
    if (stick) pre.scrollTop = pre.scrollHeight;
  };
  await poll();
  if (!pre.textContent) pre.textContent = "";
  return { poll };
}

// --------------------------------------------------------------------- router

function route() {
  gen++;
  clearInterval(timer);
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "run" && parts[1]) viewRun(parts[1], parts[2]);
  else viewList();
}
window.addEventListener("hashchange", route);
route();

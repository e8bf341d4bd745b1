"use strict";
// One page over the HTTP API (API.md), refreshed every 2 s. The token stays in this browser.
const VIEWS = ["runs", "jobs", "queue", "nodes", "datasets"];
let view = location.hash.slice(1).split("/")[0] || "runs";
let token = localStorage.getItem("draftyard_token") || "";
let timer = null;

const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));
const st = s => `<span class="st ${esc(s)}">${esc(s)}</span>`;
function ago(t) {
  if (!t) return "";
  const s = (Date.now() - Date.parse(t)) / 1000;
  return s < 60 ? `${s.toFixed(0)} s ago` : s < 3600 ? `${(s / 60).toFixed(0)} min ago` : `${(s / 3600).toFixed(1)} h ago`;
}
function dur(s) {
  if (s == null || !isFinite(s)) return "";
  s = Math.round(s);
  return s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`
       : `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
}
// progress {stage, done, total, unit, rate, eta_s} -> bar + "done/total unit, rate/s, ETA"
function progress(p, status) {
  if (!p || p.total == null && p.done == null) return status === "succeeded" ? `<div class="bar"><i style="width:100%;background:var(--ok)"></i></div>` : "";
  const pct = p.total ? Math.min(100, 100 * p.done / p.total) : 0;
  const color = status === "succeeded" ? "var(--ok)" : status === "failed" ? "var(--bad)" : "var(--run)";
  const parts = [`${p.done ?? 0}${p.total ? "/" + p.total : ""} ${esc(p.unit || "")}`];
  if (p.rate) parts.push(`${p.rate >= 10 ? p.rate.toFixed(0) : p.rate.toPrecision(2)} ${esc(p.unit || "")}/s`);
  if (p.eta_s != null && status === "running") parts.push(`ETA ${dur(p.eta_s)}`);
  return `<div class="bar" title="${pct.toFixed(1)}%"><i style="width:${pct}%;background:${color}"></i></div>
          <div class="prog">${p.stage ? esc(p.stage) + ": " : ""}${parts.join(" · ")}</div>`;
}

async function api(path) {
  const r = await fetch(path, {headers: {Authorization: `Bearer ${token}`}});
  if (r.status === 401) { askToken("that token was refused"); throw new Error("401"); }
  const body = r.headers.get("content-type")?.includes("json") ? await r.json() : await r.text();
  if (!r.ok) throw new Error(body?.error?.message || `HTTP ${r.status}`);
  return body;
}

function askToken(why) {
  clearInterval(timer);
  document.getElementById("main").innerHTML = `<div class="card">
    <p>${why ? esc(why) + ". " : ""}Paste an API token (<code>cat ~/.draftyard/admin_token</code>, or one from <code>POST /v1/users</code>).</p>
    <input id="tok" type="password" placeholder="token"> <button id="save">Use it</button></div>`;
  document.getElementById("save").onclick = () => {
    token = document.getElementById("tok").value.trim();
    localStorage.setItem("draftyard_token", token);
    go(view);
  };
}

function nav() {
  document.getElementById("nav").innerHTML = VIEWS.map(v =>
    `<a class="${v === view ? "on" : ""}" href="#${v}">${v}</a>`).join("");
}

const RENDER = {
  async runs() {
    const runs = (await api("/v1/runs?limit=50")).data;
    if (!runs.length) return `<p class="muted">No runs yet: <code>POST /v1/runs</code> (or <code>draftyard demo</code>).</p>`;
    return `<table><tr><th>run</th><th>status</th><th>stages</th><th>report</th><th>created</th></tr>` +
      runs.map(r => `<tr><td><b>${esc(r.name)}</b><br><span class="mono muted">${esc(r.id)}</span></td>
        <td>${st(r.status)}</td>
        <td><div class="stages">${r.jobs.map(j => `<div class="stage click" data-go="job/${j.id}">
           <b>${esc(j.run_stage)}</b> ${st(j.status)}${j.reused_from ? ' <span class="muted">reused</span>' : ""}
           ${progress(j.progress, j.status)}</div>`).join("")}</div></td>
        <td>${report(r.report)}</td><td class="muted">${ago(r.created_at)}</td></tr>`).join("") + `</table>`;
  },
  async jobs() {
    const jobs = (await api("/v1/jobs?limit=100")).data;
    return jobTable(jobs, "No jobs yet.");
  },
  async queue() {
    const q = await api("/v1/queue");
    const users = q.users.map(u => `<tr><td>${esc(u.name || u.id)}</td><td>${u.gpus_held}</td>
      <td>${u.gpu_hours_24h}</td><td>${u.waiting}</td><td>${u.gpus_waiting}</td></tr>`).join("");
    return `<h3>running</h3>${jobTable(q.running, "Nothing running.")}
      <h3>waiting, in the order they will run</h3>${jobTable(q.waiting, "Nothing waiting.")}
      <h3>users${q.quota_gpus ? ` (quota ${q.quota_gpus} GPUs each)` : ""}</h3>
      <table><tr><th>user</th><th>GPUs held</th><th>GPU-hours (24 h)</th><th>jobs waiting</th><th>GPUs waiting</th></tr>${users}</table>`;
  },
  async nodes() {
    const nodes = (await api("/v1/nodes")).data;
    if (!nodes.length) return `<p class="muted">No worker has registered: <code>draftyard worker --node NAME</code>.</p>`;
    return `<table><tr><th>node</th><th>state</th><th>GPUs</th><th>last heartbeat</th></tr>` +
      nodes.map(n => `<tr><td><b>${esc(n.name)}</b><br><span class="muted">${esc(n.hostname || "")}</span></td>
        <td>${n.alive ? (n.draining ? st("draining") : `<span class="st succeeded">alive</span>`) : `<span class="st failed">lost</span>`}</td>
        <td>${n.gpus.map(g => `<span class="gpu ${g.job_id ? "busy" : ""}" title="${esc(g.name || "")} ${g.job_id ? "held by " + esc(g.job_id) : "free"}"
           ${g.job_id ? `data-go="job/${g.job_id}"` : ""}>${g.index}</span>`).join("") || '<span class="muted">none (CPU only)</span>'}
           <div class="prog">${n.gpus_free}/${n.gpus_total} free</div></td>
        <td class="muted">${ago(n.last_heartbeat)}</td></tr>`).join("") + `</table>`;
  },
  async datasets() {
    const ds = (await api("/v1/datasets?limit=100")).data;
    if (!ds.length) return `<p class="muted">No datasets yet: <code>POST /v1/datasets</code>.</p>`;
    return `<table><tr><th>dataset</th><th>status</th><th>format</th><th>records</th><th>rejected</th><th>prompt-only</th><th>created</th></tr>` +
      ds.map(d => `<tr><td><b>${esc(d.name)}</b><br><span class="mono muted">${esc(d.id)}</span></td><td>${st(d.status)}</td>
        <td>${esc(d.format || "")}</td><td>${d.num_records ?? ""}</td><td>${d.num_rejected ?? ""}</td>
        <td>${d.stats?.user_only ?? ""}</td><td class="muted">${ago(d.created_at)}</td></tr>`).join("") + `</table>`;
  },
  async job(id) {
    const [j, ev, logs, metrics] = await Promise.all([api(`/v1/jobs/${id}`),
      api(`/v1/jobs/${id}/events?limit=5000`), api(`/v1/jobs/${id}/logs?tail=60`).catch(() => ""),
      api(`/v1/jobs/${id}/metrics`).catch(() => ({}))]);
    const charts = Object.entries(metrics || {}).filter(([, s]) => Array.isArray(s) && s.length > 1)
      .map(([k, s]) => `<div><b>${esc(k)}</b> ${spark(s)} <span class="muted">last ${(+s[s.length - 1][1]).toPrecision(4)}</span></div>`).join("");
    return `<div class="card"><b>${esc(j.type)}</b> ${esc(j.name || "")} <span class="mono muted">${esc(j.id)}</span> ${st(j.status)}
      <span class="muted">attempt ${j.attempt}${j.node ? " on " + esc(j.node) : ""}${j.gpus_assigned.length ? ", GPUs " + j.gpus_assigned.map(g => g.index).join(",") : ""}</span>
      ${j.pending_reason ? `<div class="muted">waiting: ${esc(j.pending_reason)}${j.queue_position != null ? " (position " + j.queue_position + ")" : ""}</div>` : ""}
      ${j.error ? `<div class="err">${esc(j.error.code)}: ${esc(j.error.message)}</div>` : ""}
      ${progress(j.progress, j.status)}
      ${j.outputs.length ? `<div>outputs: ${j.outputs.map(a => `<code>${esc(a)}</code>`).join(" ")}</div>` : ""}
      ${j.reused_from ? `<div class="muted">reused from ${esc(j.reused_from)}</div>` : ""}</div>
      ${charts ? `<div class="card">${charts}</div>` : ""}
      ${Object.keys(j.metrics_summary).length ? `<div class="card"><pre>${esc(JSON.stringify(j.metrics_summary, null, 2))}</pre></div>` : ""}
      <div class="card"><b>events</b><pre>${ev.data.slice(-40).map(e => `${e.at?.slice(11, 19) ?? ""} ${e.kind.padEnd(8)} ${esc(JSON.stringify(e.data))}`).join("\n")}</pre></div>
      <div class="card"><b>log</b><pre>${esc(logs)}</pre></div>`;
  },
};

function report(r) {
  if (!r) return "";
  const tau = x => typeof x === "number" ? x.toFixed(2) : esc(x ?? "");
  const verdict = r.verdict ? `<br><span class="st ${r.verdict === "accept" ? "succeeded" : "failed"}">${esc(r.verdict)}</span>` : "";
  return `tau <b>${tau(r.tau)}</b>${r.tau_baseline != null ? ` vs ${tau(r.tau_baseline)} untrained` : ""}${verdict}`;
}

function jobTable(jobs, empty) {
  if (!jobs.length) return `<p class="muted">${empty}</p>`;
  return `<table><tr><th>job</th><th>status</th><th>owner</th><th>GPUs</th><th>progress</th><th>created</th></tr>` +
    jobs.map(j => `<tr class="click" data-go="job/${j.id}"><td><b>${esc(j.type)}</b> ${esc(j.name || "")}<br><span class="mono muted">${esc(j.id)}</span></td>
      <td>${st(j.status)}${j.queue_position != null ? ` <span class="muted">#${j.queue_position}</span>` : ""}
        ${j.pending_reason ? `<div class="prog">${esc(j.pending_reason)}</div>` : ""}
        ${j.error ? `<div class="prog err">${esc(j.error.code)}</div>` : ""}</td>
      <td>${esc(j.owner)}</td><td>${j.gpus_assigned.length ? j.gpus_assigned.map(g => esc(g.node) + ":" + g.index).join(" ") : j.gpus_requested || ""}</td>
      <td>${progress(j.progress, j.status)}</td><td class="muted">${ago(j.created_at)}</td></tr>`).join("") + `</table>`;
}

function spark(series) {
  const w = 220, h = 36;
  series = series.map((p, i) => [p[0] ?? i, +p[1]]);
  const xs = series.map(p => +p[0]), ys = series.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const pts = series.map(p => `${((p[0] - x0) / (x1 - x0 || 1) * w).toFixed(1)},${(h - (p[1] - y0) / (y1 - y0 || 1) * h).toFixed(1)}`);
  return `<svg width="${w}" height="${h}" style="vertical-align:middle"><polyline fill="none" stroke="#58a6ff" stroke-width="1.5" points="${pts.join(" ")}"/></svg>`;
}

async function draw() {
  const [v, arg] = location.hash.slice(1).split("/");
  view = VIEWS.includes(v) || v === "job" ? v : "runs";
  nav();
  try {
    const html = await RENDER[view](arg);
    document.getElementById("main").innerHTML = html;
  } catch (e) {
    if (e.message !== "401") document.getElementById("main").innerHTML = `<p class="err">${esc(e.message)}</p>`;
  }
}

function go() {
  if (!token) return askToken("");
  clearInterval(timer);
  draw();
  timer = setInterval(draw, 2000);
}

window.addEventListener("hashchange", go);
// One delegated handler instead of onclick attributes, which the page's CSP forbids.
document.addEventListener("click", e => {
  const t = e.target.closest && e.target.closest("[data-go]");
  if (t) location.hash = t.dataset.go;
});
document.getElementById("who").textContent = location.host;
go();

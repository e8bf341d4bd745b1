"use strict";
// One page over the HTTP API (docs/API.md), refreshed every 2 s. The token stays in this browser.
const VIEWS = ["runs", "jobs", "queue", "nodes", "datasets"];
let view = location.hash.slice(1).split("/")[0] || "runs";
let token = localStorage.getItem("draftyard_token") || "";
let timer = null;
let RUN_DONE = null;  // a finished run's page is drawn once, not every 2 s (its plot would flicker)

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
// progress {stage, done, total, unit, rate, eta_s} -> bar + "done/total unit, rate/s, ETA";
// `stage` names a phase's place when the stage has phases ("evaluate: with the drafter (3/6)"),
// and a slow rate reads as seconds each (a one-minute train step), as the CLI's bars do
// (app/cli/view.py progress_info).
function progress(p, status) {
  if (!p || p.total == null && p.done == null) return status === "succeeded" ? `<div class="bar"><i style="width:100%;background:var(--ok)"></i></div>` : "";
  const pct = p.total ? Math.min(100, 100 * p.done / p.total) : 0;
  const color = status === "succeeded" ? "var(--ok)" : status === "failed" ? "var(--bad)" : "var(--run)";
  const parts = [`${p.done ?? 0}${p.total ? "/" + p.total : ""} ${esc(p.unit || "")}`];
  if (p.rate) parts.push(p.rate < 0.1 ? `${Math.round(1 / p.rate)} s each`
    : `${p.rate >= 10 ? p.rate.toFixed(0) : p.rate.toPrecision(2)} ${esc(p.unit || "")}/s`);
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
    <p>${why ? esc(why) + ". " : ""}Paste an API token (the server's admin token: <code id="token-file">cat ${esc(document.body?.dataset?.tokenFile || "$DRAFTYARD_HOME/admin_token")}</code>, or a user's from <code>draftyard users add NAME</code>).</p>
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
    const [runs, who] = await Promise.all([api("/v1/runs?limit=50").then(b => b.data), owners()]);
    if (!runs.length) return `<p class="muted">No runs yet: <code>POST /v1/runs</code> (or <code>draftyard demo</code>).</p>`;
    return `<table><tr><th>run</th><th>owner</th><th>status</th><th>stages</th><th>report</th><th>created</th></tr>` +
      runs.map(r => `<tr><td><a class="runlink" href="#run/${esc(r.id)}"><b>${esc(r.name)}</b></a><br><span class="mono muted">${esc(r.id)}</span></td>
        <td style="white-space:nowrap">${esc(who[r.owner] || r.owner)}</td>
        <td>${st(r.status)}</td>
        <td><div class="stages">${r.jobs.map(j => `<div class="stage click" data-go="job/${j.id}">
           <b>${esc(j.run_stage)}</b> ${st(j.status)}${j.reused_from ? ' <span class="muted">reused</span>' : ""}
           ${progress(j.progress, j.status)}</div>`).join("")}</div></td>
        <td>${report(r.report)}</td><td class="muted">${ago(r.created_at)}</td></tr>`).join("") + `</table>`;
  },
  async jobs() {
    const [jobs, who] = await Promise.all([api("/v1/jobs?limit=100").then(b => b.data), owners()]);
    return jobTable(jobs, "No jobs yet.", who);
  },
  async queue() {
    const [q, who] = await Promise.all([api("/v1/queue"), owners()]);
    const users = q.users.map(u => `<tr><td>${esc(u.name || u.id)}</td><td>${u.running ?? ""}</td><td>${u.gpus_held}</td>
      <td>${u.gpu_hours_24h}</td><td>${u.waiting}</td><td>${u.gpus_waiting}</td></tr>`).join("");
    return `<h3>running</h3>${jobTable(q.running, "Nothing running.", who)}
      <h3>waiting, in the order they will run</h3>${jobTable(q.waiting, "Nothing waiting.", who)}
      <h3>users${q.quota_gpus ? ` (quota ${q.quota_gpus} GPUs each)` : ""}</h3>
      <table id="queue-users"><tr><th>user</th><th>jobs running</th><th>GPUs held</th><th>GPU-hours (24 h)</th><th>jobs waiting</th><th>GPUs waiting</th></tr>${users}</table>`;
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
      ds.map(d => `<tr><td><b>${esc(d.name)}</b><br><span class="mono muted">${esc(d.id)}</span></td><td>${st(d.status)}${d.status === "failed" ? `<div class="prog err ds-error">${esc(d.error?.message || d.error?.code || "the ingest failed")}</div>` : ""}${d.job_id ? `<div class="prog"><a class="joblink" href="#job/${esc(d.job_id)}">${d.status === "failed" ? "the failed job" : "its job"} ${esc(d.job_id)}</a></div>` : ""}</td>
        <td>${esc(d.format || "")}</td><td>${d.num_records ?? ""}</td><td>${d.num_rejected ?? ""}</td>
        <td>${d.stats?.user_only ?? ""}</td><td class="muted">${ago(d.created_at)}</td></tr>`).join("") + `</table>`;
  },
  async job(id) {
    const [j, ev, logs, metrics] = await Promise.all([api(`/v1/jobs/${id}`),
      api(`/v1/jobs/${id}/events?limit=5000`), api(`/v1/jobs/${id}/logs?tail=60`).catch(() => ""),
      api(`/v1/jobs/${id}/metrics`).catch(() => ({}))]);
    const charts = Object.entries(metrics || {}).filter(([, s]) => Array.isArray(s) && s.length > 0)
      .map(([k, s]) => `<div class="spark-row"><b title="${esc(k)}">${esc(label(k))}</b> ${spark(s)} <span class="muted">last ${(+s[s.length - 1][1]).toPrecision(4)} (${s.length} point${s.length === 1 ? "" : "s"})</span></div>`).join("");
    const who = await me();
    return `<div class="card"><b>${esc(j.type)}</b> ${esc(j.name || "")} <span class="mono muted">${esc(j.id)}</span> ${st(j.status)}${j.held ? ' <span class="st pending">held</span>' : ""}
      <span class="muted">attempt ${j.attempt}${j.node ? " on " + esc(j.node) : ""}${j.gpus_assigned.length ? ", GPUs " + j.gpus_assigned.map(g => g.index).join(",") : ""}</span>
      ${j.pending_reason ? `<div class="muted">waiting: ${esc(j.pending_reason)}${j.queue_position != null ? " (position " + j.queue_position + ")" : ""}</div>` : ""}
      ${j.error ? `<div class="err">${esc(j.error.code)}: ${esc(j.error.message)}</div>` : ""}
      ${progress(j.progress, j.status)}
      ${j.outputs.length ? `<div>outputs: ${j.outputs.map(a => `<code>${esc(a)}</code>`).join(" ")}</div>` : ""}
      ${j.reused_from ? `<div class="muted">reused from ${esc(j.reused_from)}</div>` : ""}
      ${jobActions(j, who)}</div>
      ${charts ? `<div class="card">${charts}</div>` : ""}
      ${failures(j)}
      ${summary(j.metrics_summary)}
      <div class="card"><b>events</b><pre>${ev.data.slice(-40).map(e => `${e.at?.slice(11, 19) ?? ""} ${e.kind.padEnd(8)} ${esc(JSON.stringify(e.data))}`).join("\n")}</pre></div>
      <div class="card"><b>log</b> <span class="muted">${ENDED.includes(j.status) ? "last 60 lines" : "live: the last 60 lines, every 2 s"}</span><pre id="log-tail">${esc(logs)}</pre></div>`;
  },
  // The run report people read (GET /v1/runs/{id}/report, app/runs/report.py): verdict
  // first, tau trained vs untrained, acceptance per position, training curves, the evaluate
  // plot, the serve command, and where every artifact came from.
  async run(id) {
    const [r, runObj, who] = await Promise.all([api(`/v1/runs/${id}/report`), api(`/v1/runs/${id}`), me()]);
    const ev = r.evaluation || {}, run = r.run;
    RUN_DONE = ["succeeded", "failed", "cancelled"].includes(run.status) ? id : null;
    const f2 = x => typeof x === "number" ? x.toFixed(2) : "–";
    const verdict = ev.verdict
      ? `<div id="verdict" class="verdict ${ev.verdict === "accept" ? "accept" : "reject"}">Verdict: ${esc(ev.verdict)}
           ${ev.verdict_reason ? `<small>${esc(ev.verdict_reason)}</small>` : ""}</div>`
      : `<div id="verdict" class="verdict none">No verdict yet <small>the evaluate stage has not finished (run ${esc(run.status)})</small></div>`;
    const oov = ev.oov_share ?? ev.oov_reference_share;
    const taus = `<div id="tau" class="card taus">
        <div><div class="lab">trained drafter tau</div><div class="big">${f2(ev.tau)}</div></div>
        <div><div class="lab">untrained drafter tau</div><div class="big muted">${f2(ev.tau_baseline)}</div></div>
        <div><div class="lab">prompt lookup tau (no training)</div><div class="big muted">${f2(ev.tau_prompt_lookup)}</div></div>
        ${ev.tau_sim != null ? `<div><div class="lab">simulated (teacher-forced)</div><div>${f2(ev.tau_sim)} vs ${f2(ev.tau_sim_baseline)}</div></div>` : ""}
        ${oov != null ? `<div><div class="lab">reference tokens outside the draft vocabulary</div><div>${(100 * oov).toFixed(1)}%</div></div>` : ""}
        <div id="evaluated-on"><div class="lab">evaluated on</div><div>${esc(ev.evaluated_on || "not stated")}</div></div>
        ${ev.data ? `<div id="eval-data"><div class="lab">evaluation data</div><div>${ev.data.dataset
          ? `<b>${esc(ev.data.dataset.name)}</b> <span class="mono muted">${esc(ev.data.dataset.id)}, ${esc(ev.data.artifact_id)}</span>`
          : `<span class="mono">${esc(ev.data.artifact_id)}</span> <span class="muted">(${esc(ev.data.kind)})</span>${ev.data.made_from
            ? ` made from <b>${esc(ev.data.made_from.name)}</b> <span class="mono muted">${esc(ev.data.made_from.id)}</span>` : ""}`}</div></div>` : ""}
        <div class="muted" style="font-size:12px">tau = tokens accepted per target forward pass (greedy speculative decoding; 1.00 = no speedup)</div></div>`;
    // tau per source dataset when the evaluation set mixes them (code vs chat differ a lot)
    const bySource = ev.by_source ? `<div class="card"><b>tau by source</b> <span class="muted">the evaluation set mixes datasets</span>
      <table id="by-source"><tr><th>source</th><th>prompts</th><th>trained tau</th><th>untrained tau</th></tr>
      ${Object.entries(ev.by_source).map(([name, s]) => `<tr><td>${esc(name)}</td><td>${s.prompts ?? ""}</td>
        <td>${f2(s.tau)}</td><td class="muted">${f2(s.tau_baseline)}</td></tr>`).join("")}</table></div>` : "";
    const pp = r.per_position || {};
    const ppSeries = [["trained", "#3fb950"], ["untrained", "#8a93a6"], ["prompt_lookup", "#d29922"], ["vllm", "#58a6ff"]]
      .filter(([k]) => pp[k]).map(([k, color]) => ({name: k === "vllm" ? "trained (vLLM)" : k === "prompt_lookup" ? "prompt lookup" : `${k} drafter`, color,
        points: pp[k].map((v, i) => [i + 1, v])}));
    const perPos = ppSeries.length ? chart({id: "per-position-chart", series: ppSeries, bars: true,
        title: "Acceptance per draft position", xLabel: "draft position k", yLabel: "P(first k drafts accepted)",
        yMin: 0, yMax: 1, yFmt: v => `${Math.round(v * 100)}%`}) : `<p class="muted">No per-position acceptance in the report.</p>`;
    const cs = (r.curves && r.curves.series) || {};
    const lossS = [["loss", "#58a6ff", "train"], ["val_loss", "#d29922", "validation"]].filter(([k]) => (cs[k] || []).length > 1)
      .map(([k, color, name]) => ({name, color, points: cs[k]}));
    const accKeys = Object.keys(cs).filter(k => /^acc_\d+$/.test(k)).sort((a, b) => +a.slice(4) - +b.slice(4)).slice(0, 4);
    const palette = ["#3fb950", "#58a6ff", "#d29922", "#bc8cff"];
    const accS = (accKeys.length ? accKeys : Object.keys(cs).filter(k => /acc|eal/.test(k)).slice(0, 4))
      .filter(k => (cs[k] || []).length > 1).map((k, i) => ({name: k.replace(/^acc_(\d+)$/, "position $1"), color: palette[i], points: cs[k]}));
    const curves = `<div class="grid2">
      <div class="card">${lossS.length ? chart({id: "loss-chart", series: lossS, title: "Training loss",
          xLabel: "optimizer step", yLabel: "loss (cross-entropy, nats)"}) : '<p class="muted">No loss curve.</p>'}</div>
      <div class="card">${accS.length ? chart({id: "acceptance-curve", series: accS, title: "Training acceptance (teacher-forced)",
          xLabel: "optimizer step", yLabel: "accuracy (fraction of positions)", yMin: 0, yMax: 1}) : '<p class="muted">No acceptance curve.</p>'}</div></div>`;
    const plot = (r.plots || [])[0];
    const d = r.drafter;
    const serve = d && d.serve_command ? `<div class="card"><b>Serve it</b> <span class="muted">(drafter ${esc(d.artifact_id)}, ${d.steps ?? "?"} steps)</span>
        <div class="serve"><pre id="serve-command">${esc(d.serve_command)}</pre><button id="copy-serve" type="button">Copy</button></div></div>` : "";
    const lineage = `<div class="card"><b>Lineage of every artifact</b>
      <table id="lineage"><tr><th>artifact</th><th>kind</th><th>stage</th><th>made from</th><th>dataset</th><th>chat template (sha256)</th><th>target</th></tr>
      ${r.lineage.map(a => `<tr><td class="mono">${esc(a.id)}</td><td>${esc(a.kind)}</td><td>${esc(a.stage || "")}</td>
        <td class="mono">${a.inputs.map(esc).join("<br>") || "–"}</td>
        <td>${esc(a.dataset.name || a.dataset.id || "–")}</td>
        <td class="mono" title="${esc(a.chat_template_sha256 || "")}">${esc((a.chat_template_sha256 || "–").slice(0, 12))}</td>
        <td>${esc(a.target.name || a.target.id || "–")}</td></tr>`).join("")}</table></div>`;
    const held = Object.fromEntries(runObj.jobs.map(j => [j.id, j.held]));
    const stages = `<div class="stages">${r.stages.map(s => `<a class="stage" href="#job/${esc(s.job_id)}"><b>${esc(s.stage)}</b> ${st(s.status)}${held[s.job_id] ? ' <span class="muted">held</span>' : ""}
        <span class="muted">${s.reused_from ? `reused from <span class="mono">${esc(s.reused_from)}</span>` : `attempt ${s.attempt}`}</span>${s.error ? `<div class="prog err">${esc(s.error.code)}</div>` : ""}</a>`).join("")}</div>`;
    return `<div class="card"><b style="font-size:16px">${esc(run.name)}</b> <span class="mono muted">${esc(run.id)}</span> ${st(run.status)}
        <div class="muted">owner <b id="run-owner">${esc(run.owner.name || run.owner.id)}</b> · ${esc(run.drafter_type || "")} drafter for
        <b>${esc(r.target.name || r.target.id)}</b> on <b>${esc(r.dataset.name || r.dataset.id)}</b> · started ${ago(run.created_at)}</div>
        <div style="margin-top:8px">${stages}</div>${runActions(run, runObj.jobs, who)}</div>
      ${compared(r.drafters)}${verdict}${taus}${bySource}
      <div class="card">${perPos}</div>
      ${curves}
      ${plot ? `<div class="card"><b>Evaluate plot</b> <span class="muted">${esc(plot.path)}</span><br><img id="eval-plot" alt="acceptance per position (evaluate)" data-src="${esc(plot.url)}"></div>` : ""}
      ${serve}${lineage}`;
  },
};

// user id -> name, refreshed at most every 30 s: listings show owners by name.
let OWNERS = {at: 0, map: {}};
async function owners() {
  if (Date.now() - OWNERS.at < 30000) return OWNERS.map;
  try {
    const users = (await api("/v1/users?limit=100")).data;
    OWNERS = {at: Date.now(), map: Object.fromEntries(users.map(u => [u.id, u.name]))};
  } catch (e) { OWNERS = {at: Date.now(), map: {}}; }
  return OWNERS.map;
}

// An SVG chart with axes, ticks, axis titles (with units) and a legend; lines, or grouped
// bars over integer x. series: [{name, color, points: [[x, y], ...]}].
function chart({id, series, title, xLabel, yLabel, bars = false, yMin, yMax, yFmt}) {
  const W = 520, H = 260, L = 58, R = 12, T = 26, B = 60;
  const pts = series.flatMap(s => s.points.map(p => [+p[0], +p[1]]));
  let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
  if (bars) { x0 -= 0.5; x1 += 0.5; }
  let y0 = yMin ?? Math.min(...pts.map(p => p[1])), y1 = yMax ?? Math.max(...pts.map(p => p[1]));
  if (y1 === y0) { y1 += 1; y0 -= yMin != null ? 0 : 1; }
  const sx = x => L + (x - x0) / (x1 - x0 || 1) * (W - L - R), sy = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const fy = yFmt || (v => Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3));
  let g = "";
  for (let i = 0; i <= 4; i++) {
    const v = y0 + (y1 - y0) * i / 4, y = sy(v).toFixed(1);
    g += `<line class="gridline" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/><text x="${L - 6}" y="${+y + 4}" text-anchor="end">${fy(v)}</text>`;
  }
  // Steps are integers: ticks at whole steps, placed where their label says.
  const whole = pts.every(p => Number.isInteger(p[0]));
  const xt = bars ? [...new Set(pts.map(p => p[0]))]
    : [...new Set([0, 1, 2, 3, 4].map(i => x0 + (x1 - x0) * i / 4).map(v => whole ? Math.round(v) : v))];
  for (const v of xt) g += `<line class="axis" x1="${sx(v).toFixed(1)}" x2="${sx(v).toFixed(1)}" y1="${H - B}" y2="${H - B + 4}"/>
    <text x="${sx(v).toFixed(1)}" y="${H - B + 16}" text-anchor="middle">${Number.isInteger(v) ? v : v.toFixed(0)}</text>`;
  let marks = "";
  if (bars) {
    const bw = (sx(1) - sx(0)) * 0.8 / series.length;
    series.forEach((s, i) => { for (const [x, y] of s.points) {
      const bx = sx(x) - bw * series.length / 2 + i * bw;
      marks += `<rect x="${bx.toFixed(1)}" y="${sy(y).toFixed(1)}" width="${(bw - 1).toFixed(1)}" height="${(sy(y0) - sy(y)).toFixed(1)}" fill="${s.color}"><title>${esc(s.name)}, k=${x}: ${fy(y)}</title></rect>`;
      // The value on every bar: a zero reads as 0 %, not as a bar that failed to draw.
      marks += `<text class="bar-value" x="${(bx + bw / 2).toFixed(1)}" y="${(sy(y) - 4).toFixed(1)}" text-anchor="middle">${fy(y)}</text>`;
    } });
  } else {
    for (const s of series) marks += `<polyline fill="none" stroke="${s.color}" stroke-width="1.8" points="${s.points.map(p => `${sx(+p[0]).toFixed(1)},${sy(+p[1]).toFixed(1)}`).join(" ")}"/>`;
  }
  const legend = series.map((s, i) => `<rect x="${L + 8 + i * 150}" y="${H - 14}" width="10" height="10" fill="${s.color}"/>
    <text x="${L + 22 + i * 150}" y="${H - 5}">${esc(s.name)}</text>`).join("");
  return `<svg id="${id}" class="chart" viewBox="0 0 ${W} ${H}" width="100%" style="max-width:${W * 1.4}px" role="img" aria-label="${esc(title)}">
    <text class="ttl" x="${L}" y="15">${esc(title)}</text>${g}
    <line class="axis x-axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/><line class="axis y-axis" x1="${L}" x2="${L}" y1="${T}" y2="${H - B}"/>
    ${marks}
    <text class="x-label" x="${(L + W - R) / 2}" y="${H - B + 32}" text-anchor="middle">${esc(xLabel)}</text>
    <text class="y-label" transform="translate(14 ${(T + H - B) / 2}) rotate(-90)" text-anchor="middle">${esc(yLabel)}</text>
    ${legend}</svg>`;
}

// After a render: images behind the token (an <img> cannot send it) and the copy button;
// listeners, not inline handlers, so a strict CSP can forbid inline script.
const BLOBS = {};
async function afterRender(root) {
  for (const img of root.querySelectorAll("img[data-src]")) {
    const src = img.dataset.src;
    if (!BLOBS[src]) {
      const r = await fetch(src, {headers: {Authorization: `Bearer ${token}`}});
      if (!r.ok) { img.alt = `could not load ${src}: HTTP ${r.status}`; continue; }
      BLOBS[src] = URL.createObjectURL(await r.blob());
    }
    img.src = BLOBS[src];
  }
  const copy = root.querySelector("#copy-serve");
  if (copy) copy.addEventListener("click", async () => {
    const text = root.querySelector("#serve-command").textContent;
    try { await navigator.clipboard.writeText(text); }
    catch (e) {  // no clipboard API (plain http, not localhost): select the text instead
      const range = document.createRange();
      range.selectNodeContents(root.querySelector("#serve-command"));
      getSelection().removeAllRanges(); getSelection().addRange(range);
      document.execCommand("copy");
    }
    copy.textContent = "Copied";
  });
}

// Several drafters of one run (app/runs/compare.py): best tau first; below, the best one.
function compared(rows) {
  if (!rows || !rows.length) return "";
  const n = x => typeof x === "number" ? x.toFixed(2) : "–";
  return `<div class="card" id="drafters"><b>Drafters ranked by tau on the same evaluation</b>
    <table><tr><th>#</th><th>drafter</th><th>type</th><th>tau</th><th>untrained</th><th>prompt lookup</th>
    <th>accepted per position</th><th>train time</th><th>size</th><th>verdict</th></tr>${rows.map(r => `<tr>
    <td>${r.rank}</td><td><b>${esc(r.name)}</b></td><td>${esc(r.type || "")}</td><td><b>${n(r.tau)}</b></td>
    <td>${n(r.tau_baseline)}</td><td>${n(r.tau_prompt_lookup)}</td>
    <td class="mono">${(r.acceptance_per_position || []).map(x => Math.round(x * 100)).join(" ")}${r.acceptance_per_position ? "%" : "–"}</td>
    <td>${r.train_seconds != null ? `${Math.round(r.train_seconds)} s` : "–"}</td>
    <td>${r.drafter_bytes != null ? `${(r.drafter_bytes / 1048576).toFixed(1)} MiB` : "–"}${r.drafter_parameters != null ? ` (${(r.drafter_parameters / 1e6).toFixed(2)}M params)` : ""}</td>
    <td title="${esc(r.verdict_reason || "")}">${esc(r.verdict || "–")}</td></tr>`).join("")}</table>
    <div class="muted">below: ${esc(rows[0].name)}, the best</div></div>`;
}

function report(r) {
  if (!r) return "";
  // several drafters (app/runs/service.py refresh_run): the best one, by name
  if (r.drafters) return r.drafters.length ? `${esc(r.drafters[0].drafter)}: ${report(r.drafters[0])} <span class="muted">(best of ${r.drafters.length})</span>` : "";
  const tau = x => typeof x === "number" ? x.toFixed(2) : esc(x ?? "");
  // The verdict first: a run can succeed (the pipeline worked) with a rejected drafter.
  const verdict = r.verdict ? `<span class="st ${r.verdict === "accept" ? "succeeded" : "failed"}" title="${esc(r.verdict_reason || "")}">${esc(r.verdict)}</span><br>` : "";
  const why = r.verdict === "reject" && r.verdict_reason ? `<br><span class="muted">${esc(r.verdict_reason)}</span>` : "";
  return `${verdict}tau <b>${tau(r.tau)}</b>${r.tau_baseline != null ? ` vs ${tau(r.tau_baseline)} untrained` : ""}${why}`;
}

function failures(j) {
  // The records a stage dropped: from error.details when its budget stopped it, else its summary.
  const d = j.error && j.error.details && j.error.details.failed_sample ? j.error.details : j.metrics_summary || {};
  const rows = d.failed_sample || [];
  if (!rows.length) return "";
  return `<div class="card"><b>dropped records</b> ${esc(JSON.stringify(d.failed_by_reason || d.rejected_by_reason || {}))}
    <pre>${rows.map(f => `${esc(f.id)}${f.line != null ? " (line " + f.line + ")" : ""} ${esc(f.reason)}: ${esc(f.message || "")}`).join("\n")}</pre>
    ${d.failures_file ? `<div class="muted">full list: <code>${esc(d.failures_file)}</code></div>` : ""}</div>`;
}

function jobTable(jobs, empty, who = {}) {
  if (!jobs.length) return `<p class="muted">${empty}</p>`;
  return `<table><tr><th>job</th><th>status</th><th>owner</th><th>GPUs</th><th>progress</th><th>created</th></tr>` +
    jobs.map(j => `<tr class="click" data-go="job/${j.id}"><td><b>${esc(j.type)}</b> ${esc(j.name || "")}<br><span class="mono muted">${esc(j.id)}</span></td>
      <td>${st(j.status)}${j.queue_position != null ? ` <span class="muted">#${j.queue_position}</span>` : ""}
        ${j.pending_reason ? `<div class="prog">${esc(j.pending_reason)}</div>` : ""}
        ${j.error ? `<div class="prog err">${esc(j.error.code)}</div>` : ""}</td>
      <td>${esc(who[j.owner] || j.owner)}</td><td>${j.gpus_assigned.length ? j.gpus_assigned.map(g => esc(g.node) + ":" + g.index).join(" ") : j.gpus_requested || ""}</td>
      <td>${progress(j.progress, j.status)}</td><td class="muted">${ago(j.created_at)}</td></tr>`).join("") + `</table>`;
}

// A sparkline that stays inside its own box whatever the number of points (2-3
// points drew across the neighbouring rows): a fixed viewBox with a margin, overflow hidden,
// a dot on every point when there are few, one point drawn as a dot.
function spark(series) {
  const w = 220, h = 36, m = 4;
  series = series.map((p, i) => Array.isArray(p) ? [+(p[0] ?? i), +p[1]] : [i, +p]).filter(p => isFinite(p[0]) && isFinite(p[1]));
  if (!series.length) return "";
  const xs = series.map(p => p[0]), ys = series.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const px = x => x1 === x0 ? w / 2 : m + (x - x0) / (x1 - x0) * (w - 2 * m);
  const py = y => y1 === y0 ? h / 2 : h - m - (y - y0) / (y1 - y0) * (h - 2 * m);
  const pts = series.map(p => [px(p[0]).toFixed(1), py(p[1]).toFixed(1)]);
  const line = pts.length > 1 ? `<polyline fill="none" stroke="#58a6ff" stroke-width="1.5" points="${pts.map(p => p.join(",")).join(" ")}"/>` : "";
  const dots = pts.length <= 3 ? pts.map(([x, y]) => `<circle cx="${x}" cy="${y}" r="2.5" fill="#58a6ff"/>`).join("") : "";
  return `<svg class="spark" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" overflow="hidden">${line}${dots}</svg>`;
}

// User-facing names for stage measures (chips said tau_sim_baseline).
const LABELS = {tau: "tau (tokens per target forward)", tau_sim: "simulated tau (teacher-forced)",
  tau_baseline: "untrained drafter's tau", tau_sim_baseline: "untrained drafter's simulated tau",
  tau_prompt_lookup: "prompt lookup's tau",
  verdict: "verdict", verdict_reason: "why", evaluated_on: "evaluated on",
  oov_share: "reference tokens outside the draft vocabulary", oov_reference_share: "reference tokens outside the draft vocabulary",
  acceptance_rate_per_position: "acceptance per draft position", held_out: "records held out", train: "records to train on",
  records: "records", num_records: "records", num_rejected: "rejected records", steps: "optimizer steps",
  total_steps: "planned steps", initial_loss: "first loss", final_loss: "last loss", loss: "training loss",
  val_loss: "validation loss", seconds: "seconds", seed: "seed"};
const label = k => LABELS[k] || (/^acc_(\d+)$/.test(k) ? `accuracy at position ${k.slice(4)}` : k.replace(/_/g, " "));

function summary(m) {
  if (!m || !Object.keys(m).length) return "";
  const val = v => typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(4))
    : Array.isArray(v) && v.every(x => typeof x === "number") ? v.map(x => x.toFixed(2)).join(" · ")
    : typeof v === "object" && v !== null ? JSON.stringify(v) : String(v ?? "–");
  return `<div class="card"><b>summary</b><table id="summary">${Object.entries(m).map(([k, v]) =>
    `<tr><th title="${esc(k)}">${esc(label(k))}</th><td>${esc(val(v))}</td></tr>`).join("")}</table>
    <details><summary class="muted">as JSON</summary><pre>${esc(JSON.stringify(m, null, 2))}</pre></details></div>`;
}

// Views defined in their own files (storage.js), loaded before this one.
if (typeof renderStorage === "function") { VIEWS.push("storage"); RENDER.storage = renderStorage; }

async function draw(again) {
  const [v, arg] = location.hash.slice(1).split("/");
  view = VIEWS.includes(v) || v === "job" || v === "run" ? v : "runs";
  if (again === true && view === "run" && RUN_DONE === arg) return;
  nav();
  try {
    const html = await RENDER[view](arg);
    const main = document.getElementById("main");
    main.innerHTML = html;
    const tail = main.querySelector("#log-tail");
    if (tail) tail.scrollTop = tail.scrollHeight;  // the newest lines in view
    await afterRender(main);
  } catch (e) {
    if (e.message !== "401") document.getElementById("main").innerHTML = `<p class="err">${esc(e.message)}</p>`;
  }
}

function go() {
  if (!token) return askToken("");
  clearInterval(timer);
  draw();
  timer = setInterval(() => draw(true), 2000);
}

window.addEventListener("hashchange", go);
document.getElementById("who").textContent = location.host;
go();

// One delegated handler instead of onclick attributes, which the page's CSP forbids.
document.addEventListener("click", e => {
  const t = e.target.closest && e.target.closest("[data-go]");
  if (t) location.hash = t.dataset.go;
});

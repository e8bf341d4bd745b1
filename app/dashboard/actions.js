"use strict";
// Actions on the job and run pages: cancel, retry, hold/release and priority, as
// the API allows the user (priority is an admin's; the others the owner's or an admin's),
// each after a confirmation. Buttons carry their request in data attributes; one delegated
// listener sends it (the page's CSP forbids inline handlers).
let ME = null;
async function me() {
  if (!ME) ME = await api("/v1/users/me").catch(() => ({}));
  return ME;
}

async function post(path, body) {
  const r = await fetch(path, {method: "POST", body: body ? JSON.stringify(body) : undefined,
    headers: {Authorization: `Bearer ${token}`, ...(body ? {"Content-Type": "application/json"} : {})}});
  const out = r.headers.get("content-type")?.includes("json") ? await r.json() : {};
  if (!r.ok) throw new Error(out?.error?.message || `HTTP ${r.status}`);
  return out;
}

const WAITING = ["pending", "queued"], ENDED = ["succeeded", "failed", "cancelled"];
const btn = (label, path, ask, extra = "") =>
  `<button class="act" data-path="${esc(path)}" data-confirm="${esc(ask)}" ${extra}>${esc(label)}</button>`;

// The buttons for one job (`who`: the viewer {id, role}).
function jobActions(j, who) {
  const mine = who.role === "admin" || who.id === j.owner, p = `/v1/jobs/${j.id}`, out = [];
  if (mine && !ENDED.includes(j.status) && j.status !== "cancelling")
    out.push(btn("Cancel", `${p}/cancel`, `Cancel job ${j.id} (${j.type})?`));
  if (mine && ["failed", "cancelled"].includes(j.status))
    out.push(btn("Retry", `${p}/retry`, `Retry job ${j.id} (${j.type})?`));
  if (mine && WAITING.includes(j.status))
    out.push(j.held ? btn("Release", `${p}/release`, `Release job ${j.id}? It may start at once.`)
                    : btn("Hold", `${p}/hold`, `Hold job ${j.id}? It will not start until released.`));
  if (who.role === "admin" && !ENDED.includes(j.status))
    out.push(btn(`Priority ${j.priority}…`, `${p}/priority`, `New priority for job ${j.id} (0-100, now ${j.priority}):`,
                 `data-ask-number="${j.priority}"`));
  return out.length ? `<div class="actions" id="job-actions">${out.join(" ")}<span class="act-msg"></span></div>` : "";
}

// The buttons for a run: cancel and retry the run; hold, release and priority act on its
// waiting stages (the API has no run-level hold).
function runActions(run, jobs, who) {
  const mine = who.role === "admin" || who.id === (run.owner?.id ?? run.owner), out = [];
  const waiting = jobs.filter(j => WAITING.includes(j.status));
  if (mine && !ENDED.includes(run.status))
    out.push(btn("Cancel run", `/v1/runs/${run.id}/cancel`, `Cancel run ${run.id} (${run.name}) and its unfinished stages?`));
  if (mine && ["failed", "cancelled"].includes(run.status))
    out.push(btn("Retry run", `/v1/runs/${run.id}/retry`, `Retry the failed and cancelled stages of run ${run.id}?`));
  const held = waiting.filter(j => j.held), free = waiting.filter(j => !j.held);
  if (mine && free.length)
    out.push(btn(`Hold ${free.length} waiting stage(s)`, free.map(j => `/v1/jobs/${j.id}/hold`).join(" "),
                 `Hold the waiting stages of run ${run.id} (${free.map(j => j.run_stage).join(", ")})?`));
  if (mine && held.length)
    out.push(btn(`Release ${held.length} held stage(s)`, held.map(j => `/v1/jobs/${j.id}/release`).join(" "),
                 `Release the held stages of run ${run.id} (${held.map(j => j.run_stage).join(", ")})?`));
  if (who.role === "admin" && waiting.length)
    out.push(btn("Priority…", waiting.map(j => `/v1/jobs/${j.id}/priority`).join(" "),
                 `New priority for the waiting stages of run ${run.id} (0-100):`, `data-ask-number="${waiting[0].priority}"`));
  return out.length ? `<div class="actions" id="run-actions">${out.join(" ")}<span class="act-msg"></span></div>` : "";
}

document.addEventListener("click", async e => {
  const b = e.target.closest && e.target.closest("button.act");
  if (!b) return;
  let body;
  if (b.dataset.askNumber != null) {
    const v = prompt(b.dataset.confirm, b.dataset.askNumber);
    if (v == null) return;
    const n = Number(v);
    if (!Number.isInteger(n) || n < 0 || n > 100) { alert(`priority must be a whole number 0-100, not ${v}`); return; }
    body = {priority: n};
  } else if (!confirm(b.dataset.confirm)) return;
  const msg = b.parentElement.querySelector(".act-msg");
  try {
    for (const path of b.dataset.path.split(" ")) await post(path, body);
    if (msg) { msg.className = "act-msg ok"; msg.textContent = "done"; }
    RUN_DONE = null;  // a finished run's page redraws: its status changed
    setTimeout(() => draw(), 300);
  } catch (err) {
    if (msg) { msg.className = "act-msg err"; msg.textContent = err.message; }
  }
});

"use strict";
// The storage view: GET /v1/storage drawn as volume bars and tables by kind, owner
// and run, with what retention would free. Loaded before app.js, which adds it to VIEWS; it
// uses app.js's helpers (api, esc) only when it is drawn.
function bytes(n) {
  let x = +(n || 0);
  for (const u of ["B", "KiB", "MiB", "GiB", "TiB"]) {
    if (Math.abs(x) < 1024 || u === "TiB") return u === "B" ? `${x.toFixed(0)} B` : `${x.toFixed(1)} ${u}`;
    x /= 1024;
  }
  return "";
}

function volumeBar(v) {
  const used = v.total_bytes ? 100 * v.used_bytes / v.total_bytes : 0;
  const res = v.total_bytes ? Math.min(100 - used, 100 * v.reserved_bytes / v.total_bytes) : 0;
  return `<div class="vol"><b>${esc(v.name)}</b>${v.same_as ? ` <span class="muted">(same filesystem as ${esc(v.same_as)})</span>` : ""}
    <span class="mono muted">${esc(v.path)}</span>
    <div class="bar big" title="${used.toFixed(1)}% used, ${res.toFixed(1)}% reserved"><i style="width:${used}%"></i><i class="res" style="width:${res}%"></i></div>
    <div class="prog">${bytes(v.used_bytes)} used of ${bytes(v.total_bytes)} · ${bytes(v.reserved_bytes)} reserved by running jobs ·
      <b>${bytes(v.free_after_reservations_bytes)}</b> free after reservations</div></div>`;
}

function shareRows(rows, label, total) {
  if (!rows.length) return `<tr><td colspan="4" class="muted">none</td></tr>`;
  return rows.map(r => `<tr><td>${label(r)}</td><td>${r.count}</td><td>${bytes(r.bytes)}</td>
    <td><div class="bar"><i style="width:${total ? 100 * r.bytes / total : 0}%"></i></div></td></tr>`).join("");
}

async function renderStorage() {
  const u = await api("/v1/storage");
  const total = u.artifacts.bytes;
  const rc = u.reclaimable;
  const missing = (u.check && u.check.missing) || [];
  const table = (head, rows) => `<table><tr>${head.map(h => `<th>${h}</th>`).join("")}<th>share</th></tr>${rows}</table>`;
  return `<div class="card">${u.volumes.map(volumeBar).join("")}</div>
    <div class="card taus"><div><div class="big">${bytes(total)}</div><div class="lab">${u.artifacts.count} live artifacts</div></div>
      <div><div class="big">${bytes(rc.bytes)}</div><div class="lab">reclaimable now (${rc.count} items: hidden states ${bytes(rc.by_what.hidden_states)}, scratch ${bytes(rc.by_what.scratch)})</div></div>
      <div><div class="big">${bytes(u.deleted.bytes_freed)}</div><div class="lab">freed by ${u.deleted.count} deletes</div></div></div>
    ${missing.length ? `<p class="err">artifacts without files and no tombstone: ${missing.map(esc).join(", ")}</p>` : ""}
    <div class="grid2">
      <div class="card"><h3>by kind</h3>${table(["kind", "artifacts", "bytes"], shareRows(u.by_kind, r => esc(r.kind), total))}</div>
      <div class="card"><h3>by owner</h3>${table(["owner", "artifacts", "bytes"], shareRows(u.by_owner,
        r => `${esc(r.name || r.owner || "(none)")}${r.quota_bytes ? ` <span class="muted">quota ${bytes(r.quota_bytes)}</span>` : ""}`, total))}</div>
    </div>
    <div class="card"><h3>by run</h3>${table(["run", "artifacts", "bytes"], shareRows(u.by_run,
      r => `<a class="runlink" href="#run/${esc(r.run_id)}"><b>${esc(r.name)}</b></a> <span class="mono muted">${esc(r.run_id)}</span>`, total))}</div>
    <p class="muted">Retention: <code>draftyard storage prune --dry-run</code> lists what would go; delete an artifact with <code>draftyard artifacts rm ID</code>.</p>`;
}

# ruff: noqa: E501, RUF001  (CSS and JavaScript text, not Python: long lines and typographic marks)
"""The web page's stylesheet and script: plain CSS and ES2017, served as they are (no build
step, no CDN, nothing fetched from the network but the page's own JSON endpoints)."""

from __future__ import annotations

from flowserve.observability.render import PAGE_CSS

CSS = (
    PAGE_CSS
    + """
#fs-drawing svg{max-width:100%;height:auto}
nav.crumbs{font-size:13px;margin-bottom:10px} nav.crumbs a{color:#2563eb}
.state-READY{color:#15803d;font-weight:600} .state-UNAVAILABLE{color:#b91c1c;font-weight:600}
.state-LOADING,.state-UNLOADING{color:#a16207}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;background:#e2e8f0;font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:8px}
.stat{background:#f8fafc;border:1px solid #e2e8f0;border-radius:6px;padding:6px 10px}
.stat b{display:block;font-size:18px;font-variant-numeric:tabular-nums} .stat span{font-size:12px;color:#64748b}
svg .fs-counter{font:11px DejaVu Sans Mono,Menlo,monospace;fill:#0f172a}
svg .fs-counter.fs-bad{fill:#b91c1c;font-weight:bold}
svg .fs-has-error rect,svg .fs-has-error polygon,svg .fs-has-error path{stroke:#dc2626 !important;
  stroke-width:3 !important}
svg .fs-flash rect,svg .fs-flash polygon{stroke:#2563eb;stroke-width:3}
tr.sel{background:#dbeafe} tr.clickable{cursor:pointer} tr.clickable:hover{background:#f1f5f9}
.timeline{font-size:12px;width:100%}
.timeline .row{display:grid;grid-template-columns:260px 1fr 220px;align-items:center;
  border-bottom:1px solid #f1f5f9;min-height:22px}
.timeline .lane{position:relative;height:16px;background:#f8fafc}
.timeline .bar{position:absolute;top:2px;height:12px;border-radius:3px;background:#60a5fa;min-width:2px}
.timeline .bar.error{background:#dc2626} .timeline .bar.skipped{background:repeating-linear-gradient(
  45deg,#cbd5e1,#cbd5e1 3px,#f1f5f9 3px,#f1f5f9 6px);width:100% !important;left:0 !important}
.timeline .nested .name{padding-left:18px;color:#475569}
.timeline .info{padding-left:8px;color:#334155;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.timeline .info.error{color:#b91c1c}
button{font:inherit;font-size:12px;padding:3px 10px;border:1px solid #94a3b8;border-radius:5px;background:#fff;
  cursor:pointer} button:hover{background:#f1f5f9}
.err{color:#b91c1c;font-size:12px}
"""
)

GRAPH_JS = r"""
"use strict";
(function () {
  const cfg = JSON.parse(document.getElementById("fs-config").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const q = (id) => document.getElementById(id);
  const fmtUs = (us) => us >= 1e6 ? (us / 1e6).toFixed(2) + " s" : us >= 1000 ? (us / 1000).toFixed(2) + " ms"
    : us.toFixed(0) + " µs";
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
    '"': "&quot;", "'": "&#39;"}[c]));
  const api = (path) => cfg.api + path;
  const enc = encodeURIComponent;
  const last = {};
  let selected = null;
  let lastTraceIds = "";

  function counter(el) {
    let t = el.querySelector("text.fs-counter");
    if (!t) {
      const box = el.getBBox();
      t = document.createElementNS(SVGNS, "text");
      t.setAttribute("class", "fs-counter");
      t.setAttribute("x", box.x);
      t.setAttribute("y", box.y + box.height + 13);
      el.appendChild(t);
    }
    return t;
  }

  function batches(b) {
    const keys = Object.keys(b).map(Number).sort((x, y) => x - y);
    return keys.length ? keys.map((k) => k + "×" + b[k]).join(" ") : "–";
  }

  function renderNodes(stats) {
    const rows = [];
    for (const n of stats.nodes) {
      const el = n.element_id ? q(n.element_id) : null;
      if (el) {
        const t = counter(el);
        t.textContent = n.calls + " calls · " + n.errors + " err" + (n.skipped ? " · " + n.skipped + " skip" : "") +
          " · " + fmtUs(n.avg_us) + (n.in_flight ? " · " + n.in_flight + " in" : "");
        t.classList.toggle("fs-bad", n.errors > 0);
        el.classList.toggle("fs-has-error", n.errors > 0);
        if (last[n.name] !== undefined && last[n.name] !== n.calls) {
          el.classList.add("fs-flash");
          setTimeout(() => el.classList.remove("fs-flash"), 400);
        }
      }
      last[n.name] = n.calls;
      const tgt = n.target ? esc(n.target.name) + ": " + n.target.success + " ok, queue " +
        fmtUs(n.target.avg_queue_us) + ", compute " + fmtUs(n.target.avg_compute_us) + ", batches " +
        batches(n.target.batches) : "";
      rows.push("<tr data-node=\"" + esc(n.name) + "\"><td><b>" + esc(n.name) + "</b></td><td>" + esc(n.kind) +
        "</td><td class=num>" + n.calls + "</td><td class=num>" + n.errors + "</td><td class=num>" + n.skipped +
        "</td><td class=num>" + n.in_flight + "</td><td class=num>" + fmtUs(n.avg_us) +
        "</td><td class=num>" + fmtUs(n.queue_us) + "</td><td class=num>" + fmtUs(n.compute_us) +
        "</td><td>" + batches(n.batches) + "</td><td class=muted>" + tgt + "</td><td class=err>" +
        esc(n.last_error) + "</td></tr>");
    }
    q("fs-nodes").innerHTML = rows.join("");
  }

  function renderModel(stats) {
    const m = stats.model;
    if (!m) {
      q("fs-model").innerHTML = "<span class=muted>not loaded</span>" +
        (stats.reason ? " <span class=err>" + esc(stats.reason) + "</span>" : "");
      return;
    }
    const cells = [["success", m.success], ["failures", m.fail], ["pending", m.pending],
      ["inferences", m.inference_count], ["executions", m.execution_count],
      ["avg request", fmtUs(m.avg_request_us)], ["avg queue", fmtUs(m.avg_queue_us)],
      ["avg compute", fmtUs(m.avg_compute_us)]];
    q("fs-model").innerHTML = cells.map((c) => "<div class=stat><b data-stat=\"" + esc(c[0]) + "\">" +
      esc(c[1]) + "</b><span>" + esc(c[0]) + "</span></div>").join("");
  }

  async function pollStats() {
    try {
      const r = await fetch(api("/graphs/" + enc(cfg.name) + "/stats?version=" + enc(cfg.version)));
      if (!r.ok) throw new Error(r.status + " " + (await r.text()));
      const s = await r.json();
      renderModel(s);
      renderNodes(s);
      q("fs-status").textContent = "updated " + new Date().toLocaleTimeString();
      document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
    } catch (e) {
      q("fs-status").textContent = "stats unavailable: " + e;
    }
  }

  function timeline(t) {
    const total = Math.max(1, ...t.timeline.map((s) => s.end_us));
    const rows = t.timeline.map((s) => {
      const left = (100 * s.start_us / total).toFixed(2), width = (100 * s.duration_us / total).toFixed(2);
      const info = s.status === "skipped" ? "skipped (branch not taken)" : s.status === "error"
        ? "error: " + s.error : fmtUs(s.duration_us) + " @ +" + fmtUs(s.start_us) +
        (s.batch_size ? " · batch " + s.batch_size : "");
      return "<div class=\"row " + (s.nested ? "nested" : "") + "\" data-node=\"" + esc(s.node) +
        "\" data-status=\"" + s.status + "\"><div class=name>" + (s.nested ? esc(s.graph) + " / " : "") + "<b>" +
        esc(s.node) + "</b></div><div class=lane><div class=\"bar " + s.status + "\" style=\"left:" + left +
        "%;width:" + width + "%\" title=\"" + esc(info) + "\"></div></div><div class=\"info " + s.status +
        "\" title=\"" + esc(info) + "\">" + esc(info) + "</div></div>";
    });
    return "<div class=muted>request <b>" + esc(t.request_id || "(no id)") + "</b> · " + esc(t.model) + " · " +
      (t.ok ? "<span class=ok>ok</span>" : "<span class=bad>failed: " + esc(t.error) + "</span>") +
      " · " + fmtUs(t.duration_us) + "</div><div class=timeline>" + rows.join("") + "</div>";
  }

  async function showTrace(id) {
    selected = id;
    for (const tr of document.querySelectorAll("#fs-traces tr")) tr.classList.toggle("sel", tr.dataset.id === id);
    const r = await fetch(api("/traces/" + enc(id)));
    q("fs-timeline").innerHTML = r.ok ? timeline(await r.json()) : "<span class=muted>trace expired</span>";
  }

  async function pollTraces() {
    try {
      const t = await fetch(api("/traces?limit=30&model=" + enc(cfg.name)));
      const data = await t.json();
      if (!t.ok) throw new Error(data.error || t.status);
      const ids = data.traces.map((t) => t.id).join(",");
      if (ids !== lastTraceIds) {
        lastTraceIds = ids;
        q("fs-traces").innerHTML = data.traces.map((t, i) => "<tr class=clickable data-id=\"" + t.id + "\"><td>#" +
          (data.total - i) + "</td><td>" + esc(t.request_id || "–") + "</td><td>" +
          (t.ok ? "<span class=ok>ok</span>" : "<span class=bad>" + esc(t.error) + "</span>") + "</td><td class=num>" +
          fmtUs(t.duration_us) + "</td><td class=num>" + t.spans + "</td><td>" +
          esc(t.failed_nodes.concat(t.skipped_nodes.map((n) => n + " (skipped)")).join(", ")) + "</td></tr>").join("")
          || "<tr><td colspan=6 class=muted>no traces yet: turn tracing on, then send requests</td></tr>";
        for (const tr of document.querySelectorAll("#fs-traces tr[data-id]")) tr.onclick = () => showTrace(tr.dataset.id);
        if (data.traces.length && (!selected || !data.traces.some((t) => t.id === selected))) {
          await showTrace(data.traces[0].id);
        } else if (selected) {
          for (const tr of document.querySelectorAll("#fs-traces tr")) tr.classList.toggle("sel", tr.dataset.id === selected);
        }
      }
      const r = await fetch(api("/trace-settings?model=" + enc(cfg.name)));
      const s = await r.json();
      if (!r.ok) throw new Error(s.error || r.status);  // e.g. a graph that is not loaded
      q("fs-trace-settings").textContent = "trace_level " + s.trace_level.join(",") + " · trace_rate " +
        s.trace_rate + " · trace_count " + s.trace_count;
    } catch (e) {
      q("fs-trace-settings").textContent = "traces unavailable: " + (e.message || e);
    }
  }

  async function setTracing(on) {
    const body = on ? {trace_level: ["TIMESTAMPS"], trace_rate: "1", trace_count: "-1"} : {trace_level: ["OFF"]};
    await fetch(api("/trace-settings?model=" + enc(cfg.name)), {method: "POST", body: JSON.stringify(body),
      headers: {"content-type": "application/json"}});
    pollTraces();
  }

  q("fs-trace-on").onclick = () => setTracing(true);
  q("fs-trace-off").onclick = () => setTracing(false);
  pollStats();
  pollTraces();
  setInterval(pollStats, cfg.interval_ms);
  setInterval(pollTraces, Math.max(cfg.interval_ms, 1500));
})();
"""

INDEX_JS = r"""
"use strict";
(function () {
  const cfg = JSON.parse(document.getElementById("fs-config").textContent);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
    '"': "&quot;", "'": "&#39;"}[c]));
  async function poll() {
    try {
      const data = await (await fetch(cfg.api + "/models")).json();
      document.getElementById("fs-models").innerHTML = data.models.map((m) =>
        "<tr><td><a href=\"" + cfg.base + "/graph/" + encodeURIComponent(m.name) + "\"><b>" + esc(m.name) +
        "</b></a></td><td>" + esc(m.version) + "</td><td class=\"state-" + esc(m.state) + "\">" + esc(m.state) +
        "</td><td>" + esc(m.kind) + "</td><td>" + esc(m.platform) + "</td><td class=num>" + m.nodes +
        "</td><td class=num>" + m.success + "</td><td class=num>" + m.fail + "</td><td class=err>" +
        esc(m.reason) + "</td></tr>").join("");
    } catch (e) { /* keep the last table */ }
  }
  setInterval(poll, cfg.interval_ms);
})();
"""

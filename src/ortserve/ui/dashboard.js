// The dashboard: polls /ui/stats (every second by default; ?interval=ms) and draws uPlot charts.
"use strict";

(function () {
  const { apiFetch, errorText, el } = window.ort;
  const $ = (id) => document.getElementById(id);
  const KEEP = 300;  // points per chart (5 min at 1 s)
  const interval = Math.max(200, parseInt(new URLSearchParams(location.search).get("interval"), 10) || 1000);
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

  // chart id -> series: [label, color var, value from a stats snapshot]
  const SPECS = {
    "chart-tps": [["tok/s", "--s1", (s) => s.tokens_per_second]],
    "chart-load": [["running", "--s1", (s) => s.running], ["waiting", "--s2", (s) => s.waiting]],
    "chart-ttft": [["p50", "--s1", (s) => s.ttft.p50], ["p90", "--s2", (s) => s.ttft.p90],
                   ["p99", "--s3", (s) => s.ttft.p99]],
    "chart-tpot": [["p50", "--s1", (s) => s.tpot.p50], ["p90", "--s2", (s) => s.tpot.p90],
                   ["p99", "--s3", (s) => s.tpot.p99]],
    "chart-mem": [["RSS MB", "--s1", (s) => s.memory.rss_mb]],
    "chart-cache": [["hit rate %", "--s1", (s) => s.prefix_cache && s.prefix_cache.hit_rate != null
                                                  ? 100 * s.prefix_cache.hit_rate : null]],
  };
  const charts = {};
  const data = {};
  const dash = { charts, data, polls: 0, last: null };

  function makeChart(id) {
    const box = $(id);
    const axis = { stroke: css("--muted"), grid: { stroke: css("--line"), width: 1 }, ticks: { stroke: css("--line") } };
    const series = [{}].concat(SPECS[id].map(([label, color]) => ({ label, stroke: css(color), width: 2,
                                                                      spanGaps: true })));
    data[id] = [[]].concat(SPECS[id].map(() => []));
    const opts = { width: Math.max(200, box.clientWidth), height: 180, series, axes: [axis, axis],
                   scales: { x: { time: true } }, legend: { live: false } };
    charts[id] = new uPlot(opts, data[id], box);
  }

  function push(stats) {
    for (const id of Object.keys(SPECS)) {
      const cols = data[id];
      cols[0].push(stats.time);
      SPECS[id].forEach(([, , pick], i) => cols[i + 1].push(pick(stats) ?? null));
      if (cols[0].length > KEEP) for (const c of cols) c.shift();
      charts[id].setData(cols);
    }
  }

  function tile(k, v) {
    return el("div", { class: "tile" }, el("div", { class: "v", text: v }), el("div", { class: "k", text: k }));
  }

  function fmtUptime(s) {
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return h ? h + " h " + m + " min" : m ? m + " min" : Math.round(s) + " s";
  }

  function renderTables(stats) {
    const m = stats.memory;
    const pc = stats.prefix_cache;
    const sp = stats.speculative;
    $("model-name").textContent = stats.model ? "model: " + stats.model : "model: loading";
    $("tiles").replaceChildren(
      tile("running", String(stats.running)), tile("waiting", String(stats.waiting)),
      tile("tok/s", stats.tokens_per_second.toFixed(1)), tile("requests", String(stats.total_requests)),
      tile("output tokens", String(stats.total_output_tokens)), tile("RSS", m.rss_mb.toFixed(0) + " MB"),
      tile("system memory used", m.system_used_pct.toFixed(0) + " %"), tile("uptime", fmtUptime(stats.uptime)),
      tile("prefix cache hit rate", pc && pc.hit_rate != null ? (100 * pc.hit_rate).toFixed(1) + " %" : "-"),
      tile("prompt tokens reused", pc ? String(pc.reused) : "-"),
      tile("speculation acceptance", sp && sp.acceptance != null ? (100 * sp.acceptance).toFixed(1) + " %" : "-"));
    const r = stats.router;
    const rows = (r.costs && r.costs.rows) || [];
    $("costs").replaceChildren(...(rows.length ? rows.map((c) => el("tr", {},
      el("td", { text: c.provider }), el("td", { text: c.model }), el("td", { class: "num", text: String(c.requests) }),
      el("td", { class: "num", text: c.prompt_tokens + " / " + c.completion_tokens }),
      el("td", { class: "num", text: c.cost_usd.toFixed(6) })))
      : [el("tr", {}, el("td", { colspan: "5", text: "No routed requests recorded yet." }))]));
    const saved = r.costs && r.costs.savings_usd;
    $("savings").textContent = saved != null ? "Saved vs baseline: $" + saved.toFixed(6) : "";
    $("decisions").replaceChildren(...(r.recent.length ? r.recent.map((d) => el("tr", {},
      el("td", { text: new Date(d.ts * 1000).toLocaleTimeString() }),
      el("td", { text: d.provider + ":" + d.model }), el("td", { text: d.reason }),
      el("td", { class: "num", text: d.cost_usd == null ? "-" : d.cost_usd.toFixed(6) })))
      : [el("tr", {}, el("td", { colspan: "4", text: "No routing decisions yet (model \"auto\" routes)." }))]));
  }

  async function poll() {
    try {
      const res = await apiFetch("/ui/stats");
      if (!res.ok) {
        $("status").textContent = "Stats: " + (await errorText(res));
        return;
      }
      const stats = await res.json();
      dash.polls += 1;
      dash.last = stats;
      push(stats);
      renderTables(stats);
      $("status").textContent = "";
    } catch (e) {
      $("status").textContent = "The server is not answering (" + e.message + "); retrying.";
    } finally {
      setTimeout(poll, interval);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const id of Object.keys(SPECS)) makeChart(id);
    new ResizeObserver(() => {
      for (const id of Object.keys(SPECS)) charts[id].setSize({ width: Math.max(200, $(id).clientWidth), height: 180 });
    }).observe(document.querySelector(".dash"));
    poll();
  });
  window.ortDashboard = dash;
})();

// The fallback-reasons page: a pair of charts (by family, over time) for each kind of reason,
// drawn from the JSON the page embeds, and the filters applied as soon as one changes. (The
// by-family box's height, one bar per family, comes as data-height: app.js sets it.)
"use strict";
(function () {
  const COLORS = ["#2458a6", "#a33a1b", "#1b7a3a", "#a6781f", "#6b3fa0", "#1f8a8a", "#8a1f5c", "#5c6670"];
  const OTHER = "#b8bec4";

  function color(reason, i) {
    return reason.key ? COLORS[i % COLORS.length] : OTHER;
  }

  function draw(id, config) {
    const canvas = document.getElementById(id);
    if (!canvas || !window.Chart) return;
    config.options = Object.assign({ responsive: true, maintainAspectRatio: false, animation: false }, config.options);
    new window.Chart(canvas, config);
  }

  function kindCharts(kind, c, bins) {
    draw(kind + "-family", {
      type: "bar",
      data: { labels: c.families, datasets: c.reasons.map((r, i) => ({
        label: r.label, backgroundColor: color(r, i), data: r.by_family })) },
      options: { indexAxis: "y", scales: { x: { stacked: true, beginAtZero: true, ticks: { precision: 0 } }, y: { stacked: true } } },
    });
    draw(kind + "-time", {
      type: "bar",
      data: { labels: bins, datasets: c.reasons.map((r, i) => ({
        label: r.label, backgroundColor: color(r, i), data: r.over_time })) },
      options: { scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } } },
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const form = document.getElementById("fallback-filters");
    if (form) {
      form.querySelectorAll("select").forEach((s) => s.addEventListener("change", () => form.requestSubmit()));
    }
    const el = document.getElementById("fallbacks-data");
    if (!el) return;
    const d = JSON.parse(el.textContent);
    Object.keys(d.kinds).forEach((kind) => { if (d.kinds[kind]) kindCharts(kind, d.kinds[kind], d.bins); });
  });
})();

// Charts of the pages: each page embeds its data as JSON in a <script type="application/json">.
"use strict";
(function () {
  const RUNNER_COLORS = { v2: "#1b7a3a", v1: "#a33a1b", none: "#8a8f94" };

  function data(id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function isEmpty(config) {
    const sets = config.data.datasets || [];
    return !sets.some((set) => (set.data || []).some((v) => Number(v) > 0));
  }

  // A chart with nothing to draw says so instead of showing bare axes.
  function noData(canvas) {
    const note = document.createElement("p");
    note.className = "no-data";
    note.textContent = "No data yet: no decision has been recorded for this chart.";
    canvas.replaceWith(note);
  }

  function chart(id, config) {
    const canvas = document.getElementById(id);
    if (canvas && isEmpty(config)) {
      noData(canvas);
    } else if (canvas && window.Chart) {
      config.options = Object.assign({ responsive: true, maintainAspectRatio: false, animation: false }, config.options || {});
      new window.Chart(canvas, config);
    }
  }

  function overview(d) {
    const runners = Object.keys(d.by_runner);
    chart("runner-share", {
      type: "doughnut",
      data: { labels: runners.map((r) => r.toUpperCase()),
              datasets: [{ data: runners.map((r) => d.by_runner[r]), backgroundColor: runners.map((r) => RUNNER_COLORS[r]) }] },
    });
    const days = d.days || Object.keys(d.by_day);
    chart("runner-days", {
      type: "bar",
      data: { labels: days, datasets: ["v2", "v1", "none"].map((r) => ({
        label: r.toUpperCase(), backgroundColor: RUNNER_COLORS[r], data: days.map((day) => (d.by_day[day] || {})[r] || 0) })) },
      options: { scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true } } },
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    // Heights computed by the server come as data-height: the CSP allows no style attribute.
    document.querySelectorAll("[data-height]").forEach((el) => { el.style.height = el.dataset.height + "px"; });
    const o = data("overview-data"); if (o) overview(o);
  });
})();

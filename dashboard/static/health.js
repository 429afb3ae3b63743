// The engine-health page: one line chart per measure, V1 against V2 per time bucket, drawn from
// the JSON the page embeds; a chart no bucket has a value for says so. The filters apply as
// soon as one changes.
"use strict";
(function () {
  const COLORS = { v1: "#a33a1b", v2: "#1b7a3a" };

  function noData(canvas) {
    const note = document.createElement("p");
    note.className = "no-data";
    note.textContent = "No data yet: no report in this window has this measure.";
    canvas.replaceWith(note);
  }

  function draw(canvas, labels, byRunner) {
    const runners = Object.keys(byRunner).filter((r) => byRunner[r].some((v) => v !== null));
    if (!runners.length) { noData(canvas); return; }
    if (!window.Chart) return;
    new window.Chart(canvas, {
      type: "line",
      data: { labels: labels, datasets: runners.map((r) => ({
        label: r.toUpperCase(), data: byRunner[r], borderColor: COLORS[r], backgroundColor: COLORS[r],
        spanGaps: true, pointRadius: 2, tension: 0 })) },
      options: { responsive: true, maintainAspectRatio: false, animation: false,
                 scales: { y: { beginAtZero: true } } },
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const form = document.getElementById("health-filters");
    if (form) {
      form.querySelectorAll("select").forEach((s) => s.addEventListener("change", () => form.requestSubmit()));
    }
    const el = document.getElementById("health-data");
    if (!el) return;
    const d = JSON.parse(el.textContent);
    document.querySelectorAll("canvas[data-series]").forEach((canvas) => {
      draw(canvas, d.labels, d.series[canvas.dataset.series] || {});
    });
  });
})();

// Page controls that need a script (no inline handlers: everything is bound here):
// the Matrix grid's cell detail (click, focus, arrow keys), the time-window control
// (from/to are sent only with "custom"), and htmx swapping a 422 fragment (the confirm
// form's impact line says what is wrong with the share typed in).
"use strict";
(function () {
  if (window.htmx) {
    window.htmx.config.responseHandling.unshift({ code: "422", swap: true, error: false });
  }

  // A cell carries its counts (data-c="V2,V1,none"); its family and scenario are the
  // headers of its row and column.
  function cellText(td) {
    const table = td.closest("table");
    const row = td.parentElement;
    const family = row.cells[0].textContent.trim();
    const scenario = table.tHead.rows[0].cells[td.cellIndex].textContent.trim();
    const [v2, v1, none] = td.dataset.c.split(",").map(Number);
    const n = v2 + v1 + none;
    const where = `${family} · ${scenario} (pin ${table.dataset.pin})`;
    if (!n) return `${where}: no cell (the scenario does not apply to this family).`;
    return `${where}: ${n} architecture${n === 1 ? "" : "s"}; V2 ${v2} · V1 ${v1} · ` +
      `no runner ${none}; ${Math.round((100 * v2) / n)}% get V2.`;
  }

  function matrix(table) {
    const detail = document.getElementById("cell-detail");
    const rows = Array.from(table.tBodies[0].rows).map((r) => Array.from(r.cells).filter((c) => c.tagName === "TD"));
    if (!rows.length || !rows[0].length) return;
    rows.forEach((row) => row.forEach((td) => { td.tabIndex = -1; }));
    let current = rows[0][0];
    current.tabIndex = 0;

    function select(td, focus) {
      current.tabIndex = -1;
      current.classList.remove("selected");
      current = td;
      td.tabIndex = 0;
      td.classList.add("selected");
      detail.textContent = cellText(td);
      if (focus) td.focus();
    }

    function position(td) {
      const r = rows.findIndex((row) => row.includes(td));
      return [r, rows[r].indexOf(td)];
    }

    const moves = {
      ArrowRight: ([r, c]) => [r, c + 1], ArrowLeft: ([r, c]) => [r, c - 1],
      ArrowDown: ([r, c]) => [r + 1, c], ArrowUp: ([r, c]) => [r - 1, c],
      Home: ([r]) => [r, 0], End: ([r]) => [r, rows[r].length - 1],
      PageDown: ([r, c]) => [r + 10, c], PageUp: ([r, c]) => [r - 10, c],
    };

    table.addEventListener("click", (ev) => {
      const td = ev.target.closest("td");
      if (td && table.contains(td)) select(td, true);
    });
    table.addEventListener("mouseover", (ev) => {
      const td = ev.target.closest("td");
      if (td && !td.title) td.title = cellText(td);
    });
    table.addEventListener("focusin", (ev) => {
      const td = ev.target.closest("td");
      if (td && td !== current) select(td, false);
      else if (td) detail.textContent = cellText(td);
    });
    table.addEventListener("keydown", (ev) => {
      const move = moves[ev.key];
      if (!move || !ev.target.closest("td")) return;
      ev.preventDefault();
      let [r, c] = move(position(current));
      r = Math.max(0, Math.min(rows.length - 1, r));
      c = Math.max(0, Math.min(rows[r].length - 1, c));
      select(rows[r][c], true);
    });
  }

  function windowControl(fieldset) {
    // Typing a from/to time picks "custom"; picking a preset leaves the times out of the
    // query (the server refuses from/to beside a preset rather than ignore them).
    const ranges = Array.from(fieldset.querySelectorAll("[data-window-range]"));
    const custom = fieldset.querySelector("input[name=window][value=custom]");
    ranges.forEach((input) => input.addEventListener("input", () => { custom.checked = true; }));
    const form = fieldset.closest("form");
    if (form) {
      form.addEventListener("submit", () => {
        ranges.forEach((input) => { input.disabled = !custom.checked || !input.value; });
      });
      // Back from the next page (the bfcache keeps the form as it was submitted).
      window.addEventListener("pageshow", () => ranges.forEach((input) => { input.disabled = false; }));
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    const grid = document.getElementById("matrix");
    if (grid) matrix(grid);
    document.querySelectorAll("fieldset[data-window]").forEach(windowControl);
  });
})();

// The rank heatmap: one cell per rank and step, darker where the rank took longer; straggler events
// (their rank and step) outlined, so a slow rank stands out as a dark row with marks on it.

import {el, fmt, svg} from "./dom.js";

const W = 1100, LABEL = 56, MAX_COLUMNS = 120, MAX_ROW_H = 16;

export function rankHeatmap(points, events, field = "rank_step_time_s") {
  let rows = points.filter((p) => Array.isArray(p[field]) && p[field].length);
  if (!rows.length) return el("p", {class: "muted"}, "No per-rank times yet.");
  if (rows.length > MAX_COLUMNS) {  // thinned evenly: one column per k-th point, the newest kept
    const k = Math.ceil(rows.length / MAX_COLUMNS);
    rows = rows.filter((_, i) => (rows.length - 1 - i) % k === 0);
  }
  const ranks = Math.max(...rows.map((p) => p[field].length));
  const values = rows.flatMap((p) => p[field]);
  const lo = Math.min(...values), hi = Math.max(...values);
  const rowH = Math.max(4, Math.min(MAX_ROW_H, 320 / ranks));
  const colW = (W - LABEL) / rows.length;
  const root = svg("svg", {viewBox: `0 0 ${W} ${ranks * rowH + 20}`, class: "heatmap", role: "img",
                           "aria-label": "step time per rank"});
  for (let r = 0; r < ranks; r++) {
    if (ranks <= 32 || r % Math.ceil(ranks / 16) === 0) {
      root.append(svg("text", {x: 2, y: r * rowH + rowH - 2, class: "tick"}, `rank ${r}`));
    }
  }
  rows.forEach((point, c) => {
    point[field].forEach((v, r) => {
      const level = hi > lo ? (v - lo) / (hi - lo) : 0;
      const cell = svg("rect", {x: (LABEL + c * colW).toFixed(2), y: (r * rowH).toFixed(2), width: (colW + 0.3).toFixed(2),
                                height: rowH, class: "cell", fill: `hsl(210, 70%, ${Math.round(92 - level * 62)}%)`,
                                "data-rank": r, "data-step": point.step});
      cell.append(svg("title", {}, `rank ${r}, step ${point.step}: ${fmt(v)} s`));
      root.append(cell);
    });
  });
  const stepCol = (step) => rows.findIndex((p) => p.step >= step);
  for (const ev of events.filter((e) => e.kind === "straggler" && e.data && typeof e.data.rank === "number")) {
    const c = stepCol(ev.data.step ?? 0);
    if (c < 0) continue;
    const mark = svg("rect", {x: LABEL + c * colW, y: ev.data.rank * rowH, width: Math.max(colW, 3), height: rowH,
                              class: "straggler-mark", "data-straggler-rank": ev.data.rank});
    mark.append(svg("title", {}, ev.message || "straggler"));
    root.append(mark);
  }
  root.append(svg("text", {x: LABEL, y: ranks * rowH + 14, class: "tick"},
                  `steps ${rows[0].step}–${rows[rows.length - 1].step} · ${fmt(lo)}–${fmt(hi)} s`));
  return root;
}

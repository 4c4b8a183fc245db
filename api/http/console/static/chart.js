// A small SVG line chart: one or more series over the step axis, with event marks on the same axis.

import {svg} from "./dom.js";

const W = 560, H = 200, PAD = {l: 52, r: 12, t: 12, b: 26};

function extent(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
  if (lo === hi) { lo -= 1e-9 + Math.abs(lo) * 0.05; hi += 1e-9 + Math.abs(hi) * 0.05; }
  return [lo, hi];
}

function label(v) {
  return Math.abs(v) >= 1000 || (Math.abs(v) < 0.01 && v !== 0) ? v.toExponential(1) : v.toPrecision(3);
}

// series: [{name, points: [[step, value], ...], cls}]; marks: [{step, kind, title}];
// empty: what the chart says while no series has a point.
export function lineChart(title, series, marks = [], empty = "no points yet") {
  const drawn = series.filter((s) => s.points.length);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title});
  if (!drawn.length) {
    root.append(svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "muted empty"}, empty));
    return root;
  }
  const all = drawn.flatMap((s) => s.points);
  const [x0, x1] = extent(all.map((p) => p[0]).concat(marks.map((m) => m.step)));
  const [y0, y1] = extent(all.map((p) => p[1]));
  const x = (v) => PAD.l + ((v - x0) / (x1 - x0)) * (W - PAD.l - PAD.r);
  const y = (v) => H - PAD.b - ((v - y0) / (y1 - y0)) * (H - PAD.t - PAD.b);
  root.append(svg("line", {x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b, class: "axis"}),
              svg("line", {x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b, class: "axis"}));
  for (const v of [y0, (y0 + y1) / 2, y1]) {
    root.append(svg("text", {x: PAD.l - 4, y: y(v) + 4, "text-anchor": "end", class: "tick"}, label(v)));
  }
  for (const v of [x0, x1]) {
    root.append(svg("text", {x: x(v), y: H - 8, "text-anchor": "middle", class: "tick"}, String(Math.round(v))));
  }
  for (const m of marks) {
    const mark = svg("line", {x1: x(m.step), x2: x(m.step), y1: PAD.t, y2: H - PAD.b,
                              class: `mark mark-${m.kind}`, "data-event": m.kind});
    mark.append(svg("title", {}, m.title));
    root.append(mark);
  }
  drawn.forEach((s, i) => {
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
    root.append(svg("path", {d, class: `line ${s.cls || `series-${i}`}`, "data-series": s.name,
                             "data-points": s.points.length}));
    root.append(svg("text", {x: W - PAD.r - 4, y: PAD.t + 12 + i * 14, "text-anchor": "end",
                             class: `legend ${s.cls || `series-${i}`}`}, s.name));
  });
  return root;
}

// [[step, value]] of one field of the metric points, skipping those without it.
export function seriesOf(points, field) {
  return points.filter((p) => typeof p[field] === "number").map((p) => [p.step, p[field]]);
}

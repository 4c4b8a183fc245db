// The pipeline timeline: one row per stage (data-stage), each recent step's time split into forward,
// backward, weight-grad, communication and idle blocks, as the stages measured them; the measured bubble
// beside the schedule's theoretical one.

import {el, fmt, svg} from "./dom.js";

const KINDS = [["forward_s", "forward"], ["backward_s", "backward"], ["weight_grad_s", "weight-grad"],
               ["comm_s", "comm"], ["other_s", "other"], ["idle_s", "idle"]];
const RECENT_STEPS = 6;
const ROW = 26, LABEL = 70, W = 1100;

function pct(v) {
  return typeof v === "number" ? `${(v * 100).toFixed(1)}%` : "–";
}

// points: metric points (some with `stages`); measured/theoretical: the job's bubble fractions.
export function pipelineTimeline(points, measured, theoretical) {
  const recent = points.filter((p) => Array.isArray(p.stages) && p.stages.length).slice(-RECENT_STEPS);
  const bubbles = el("p", {class: "bubbles"},
    "Bubble measured ", el("strong", {id: "bubble-measured"}, pct(measured)),
    " · theoretical ", el("strong", {id: "bubble-theoretical"}, pct(theoretical)));
  if (!recent.length) return el("div", {class: "timeline"}, bubbles, el("p", {class: "muted"}, "No stage times yet."));
  const stageIds = [...new Set(recent.flatMap((p) => p.stages.map((s) => s.stage)))].sort((a, b) => a - b);
  // Every step gets the same width, its slowest stage's wall time: the stages of a step share one clock.
  const stepWall = recent.map((p) => Math.max(...p.stages.map((s) => s.wall_s || 0), 1e-9));
  const scale = (W - LABEL - 8) / stepWall.reduce((a, b) => a + b, 0);
  const height = stageIds.length * ROW + 22;
  const root = svg("svg", {viewBox: `0 0 ${W} ${height}`, class: "timeline-chart", role: "img",
                           "aria-label": "pipeline timeline"});
  stageIds.forEach((stage, row) => {
    const g = svg("g", {"data-stage": stage, class: "stage-row"});
    const y = row * ROW + 4;
    g.append(svg("text", {x: 4, y: y + 16, class: "tick"}, `stage ${stage}`));
    let x = LABEL;
    recent.forEach((point, i) => {
      const s = point.stages.find((st) => st.stage === stage);
      let bx = x;
      for (const [field, kind] of KINDS) {
        const seconds = s && typeof s[field] === "number" ? s[field] : 0;
        if (seconds <= 0) continue;
        const width = seconds * scale;
        const block = svg("rect", {x: bx.toFixed(2), y, width: width.toFixed(2), height: ROW - 6,
                                   class: `block block-${kind}`, "data-kind": kind, "data-step": point.step});
        block.append(svg("title", {}, `step ${point.step}, stage ${stage}: ${kind} ${fmt(seconds)} s`));
        g.append(block);
        bx += width;
      }
      x += stepWall[i] * scale;
    });
    root.append(g);
  });
  let x = LABEL;
  recent.forEach((point, i) => {
    if (stepWall[i] * scale > 48) root.append(svg("text", {x: x + 2, y: height - 4, class: "tick"}, `step ${point.step}`));
    x += stepWall[i] * scale;
  });
  const legend = el("p", {class: "legend-row"}, KINDS.map(([, kind]) =>
    el("span", {class: `swatch block-${kind}`}, kind)));
  const perStage = el("table", {class: "stages"},
    el("thead", {}, el("tr", {}, ["Stage", "Forward s", "Backward s", "Weight-grad s", "Idle s", "Bubble"]
      .map((h) => el("th", {scope: "col"}, h)))),
    el("tbody", {}, stageIds.map((stage) => {
      const s = recent[recent.length - 1].stages.find((st) => st.stage === stage) || {};
      return el("tr", {"data-stage-row": stage}, el("td", {}, String(stage)), el("td", {class: "num"}, fmt(s.forward_s)),
        el("td", {class: "num"}, fmt(s.backward_s)), el("td", {class: "num"}, fmt(s.weight_grad_s)),
        el("td", {class: "num"}, fmt(s.idle_s)), el("td", {class: "num"}, pct(s.bubble_fraction)));
    })));
  return el("div", {class: "timeline"}, bubbles, root, legend, perStage);
}

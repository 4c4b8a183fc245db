// Peak memory per rank as measured, against the planner's prediction for the job's own layout
// (POST /v1/plans with the job's spec: the same figures `trainyard plan` prints).

import {api} from "./api.js";
import {el, svg} from "./dom.js";

const DEGREES = {tp: 1, pp: 1, cp: 1, ep: 1, zero: 0};
const W = 1100, BAR_H = 16, LABEL = 56;

function mib(bytes) {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

// The planner's candidate with the job's degrees (dp only where the spec sets it).
function sameLayout(candidate, parallel) {
  const c = candidate.parallel || {};
  if (parallel.dp && c.dp !== undefined && c.dp !== parallel.dp) return false;
  return Object.entries(DEGREES).every(([k, d]) => (c[k] ?? d) === (parallel[k] ?? d));
}

export async function predictedPeak(job) {
  const parallel = (job.spec && job.spec.parallel) || {};
  try {
    const plan = await api.post("/v1/plans", job.spec);
    const match = plan.candidates.find((c) => sameLayout(c, parallel));
    return match ? match.memory_bytes_per_rank : null;
  } catch {
    return null;  // a spec the planner cannot cost (a user's own program): no prediction, said below
  }
}

export function measuredPeaks(job, points) {
  const summary = job.summary && job.summary.peak_memory_bytes_per_rank;
  if (Array.isArray(summary) && summary.some((v) => typeof v === "number")) return summary;
  const last = [...points].reverse().find((p) => Array.isArray(p.peak_memory_bytes_per_rank));
  return last ? last.peak_memory_bytes_per_rank : [];
}

// predicted: bytes, null (the planner has none) or undefined (still asking it).
export function memoryBars(measured, predicted) {
  const known = measured.filter((v) => typeof v === "number");
  const note = el("p", {class: "muted", id: "memory-prediction"},
    predicted ? `Planner's prediction for this layout: ${mib(predicted)} per rank (dashed line).`
      : predicted === undefined ? "Asking the planner…" : "No prediction from the planner for this layout.");
  if (!known.length) return el("div", {}, el("p", {class: "muted"}, "No measured peak yet."), note);
  const top = Math.max(...known, predicted || 0) * 1.1;
  const x = (v) => LABEL + (v / top) * (W - LABEL - 90);
  const root = svg("svg", {viewBox: `0 0 ${W} ${measured.length * (BAR_H + 4) + 8}`, class: "memory",
                           role: "img", "aria-label": "peak memory per rank"});
  measured.forEach((v, r) => {
    const y = r * (BAR_H + 4) + 4;
    root.append(svg("text", {x: 2, y: y + BAR_H - 3, class: "tick"}, `rank ${r}`));
    if (typeof v !== "number") return;
    const over = predicted && v > predicted;
    root.append(svg("rect", {x: LABEL, y, width: (x(v) - LABEL).toFixed(1), height: BAR_H,
                             class: over ? "mem-bar over" : "mem-bar", "data-rank": r}),
                svg("text", {x: x(v) + 4, y: y + BAR_H - 3, class: "tick"}, mib(v)));
  });
  if (predicted) {
    root.append(svg("line", {x1: x(predicted), x2: x(predicted), y1: 0, y2: measured.length * (BAR_H + 4) + 8,
                             class: "mem-predicted"}));
  }
  return el("div", {}, root, note);
}

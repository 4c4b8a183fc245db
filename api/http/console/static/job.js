// One job: its numbers, live charts, pipeline timeline, rank heatmap, events, logs, checkpoints,
// spec and cancel; refreshed every ~3 s until it ends.

import {api, AuthError, token} from "./api.js";
import {clear, duration, el, fmt, redraw, section} from "./dom.js";
import {lineChart, seriesOf} from "./chart.js";
import {rankHeatmap} from "./heatmap.js";
import {logsPanel} from "./logs.js";
import {measuredPeaks, memoryBars, predictedPeak} from "./memory.js";
import {Poller} from "./poller.js";
import {pipelineTimeline} from "./timeline.js";
import {dump} from "./yaml.js";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
// The service keeps at most TRAINYARD_METRICS_MAX_POINTS (2,000) points a job, whatever its length: one
// request reads them all; a server set to keep more is read in pages of this many, never point by point.
const METRICS_PAGE = 10_000;

function facts(job) {
  const rows = [["State", el("span", {class: `state state-${job.state}`, id: "job-state"}, job.state)],
    ["Progress", el("span", {}, el("progress", {max: job.total_steps || 1, value: job.step || 0}),
                     ` ${job.step}/${job.total_steps}`)],
    ["ETA", duration(job.eta_s)], ["Samples/s", fmt(job.samples_per_s)], ["Step time s", fmt(job.step_time_s)],
    ["Loss", fmt(job.loss)], ["Restarts", String(job.restarts ?? 0)], ["World size", String(job.world_size)],
    ["Last checkpoint", job.last_checkpoint_step ?? "–"]];
  if (job.error) rows.push(["Error", job.error]);
  return el("dl", {class: "facts"}, rows.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v))));
}

function eventMarks(events) {
  return events.filter((e) => e.data && typeof e.data.step === "number")
    .map((e) => ({step: e.data.step, kind: e.kind, title: `${e.kind}: ${e.message}`}));
}

function eventList(events) {
  if (!events.length) return el("p", {class: "muted"}, "No events yet.");
  // tabindex: a scrolled list a keyboard user can scroll with the arrow keys
  const shown = events.slice(-200).reverse();
  return el("ol", {class: "events", id: "events", tabindex: "0", "aria-label": "events"}, shown.map((e) =>
    el("li", {"data-kind": e.kind},
      el("time", {}, e.ts ? new Date(e.ts).toLocaleTimeString() : ""), " ",
      el("span", {class: "event-kind"}, e.kind), e.state ? ` → ${e.state}` : "",
      e.data && typeof e.data.step === "number" ? ` (step ${e.data.step})` : "", " ",
      el("span", {class: "event-message"}, e.message || ""))));
}

// MFU where the points carry it (a GPU with a known peak FLOP/s, or TRAINYARD_PEAK_FLOPS_PER_WORKER);
// a CPU job has no peak, so its chart says so instead of staying empty.
function mfuFigure(job, points, marks) {
  const series = seriesOf(points, "mfu").map(([step, v]) => [step, v * 100]);
  const gpu = ((job.spec && job.spec.resources) || {}).gpus_per_worker > 0;
  const state = series.length ? "drawn" : !gpu ? "gpu-only" : points.length ? "no-peak" : "waiting";
  const empty = {"gpu-only": "MFU: GPU jobs only", "no-peak": "MFU: this GPU's peak FLOP/s is not known",
                 "waiting": "no points yet"}[state];
  return el("figure", {id: "mfu-chart", "data-state": state}, el("figcaption", {}, "MFU (%)"),
            lineChart("model FLOPs utilisation", [{name: "MFU %", points: series}], marks, empty));
}

function charts(job, points, events) {
  const marks = eventMarks(events);
  const loss = [{name: "loss", points: seriesOf(points, "loss"), cls: "series-0"},
                {name: "validation loss", points: seriesOf(points, "val_loss"), cls: "series-1"}];
  return el("div", {class: "charts", id: "charts", "data-points": points.length},
    el("figure", {}, el("figcaption", {}, "Loss"), lineChart("loss", loss, marks)),
    el("figure", {}, el("figcaption", {}, "Samples/s"),
       lineChart("samples per second", [{name: "samples/s", points: seriesOf(points, "samples_per_s")}], marks)),
    el("figure", {}, el("figcaption", {}, "Tokens/s"),
       lineChart("tokens per second", [{name: "tokens/s", points: seriesOf(points, "tokens_per_s")}], marks)),
    el("figure", {}, el("figcaption", {}, "Step time (s)"),
       lineChart("step time", [{name: "step time", points: seriesOf(points, "step_time_s")}], marks)),
    mfuFigure(job, points, marks));
}

// The metric points after `after`: all in one request unless the server keeps more than METRICS_PAGE.
async function metricsAfter(id, after) {
  let answer = await api.get(`/v1/jobs/${id}/metrics?after_step=${after}&limit=${METRICS_PAGE}`);
  const points = answer.points;
  while (answer.points.length === METRICS_PAGE) {
    answer = await api.get(`/v1/jobs/${id}/metrics?after_step=${points[points.length - 1].step}&limit=${METRICS_PAGE}`);
    points.push(...answer.points);
  }
  return {...answer, points};
}

async function downloadModel(job, button) {
  button.disabled = true;
  try {
    const resp = await fetch(`/v1/jobs/${encodeURIComponent(job.id)}/checkpoints/model`,
                             {headers: {"Authorization": `Bearer ${token.get() || ""}`}});
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const url = URL.createObjectURL(await resp.blob());
    const a = el("a", {href: url, download: `${job.name}-${job.id}.safetensors`});
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  } catch (err) {
    button.after(el("span", {class: "error"}, ` download failed: ${err.message}`));
  } finally {
    button.disabled = false;
  }
}

function checkpointsView(job, answer) {
  const model = answer.model || {};
  const button = el("button", {type: "button", id: "download-model", disabled: !model.available},
                    model.available ? `Download the exported model (${fmt(model.bytes)} bytes)` : "No exported model yet");
  button.addEventListener("click", () => downloadModel(job, button));
  return el("div", {},
    answer.checkpoints.length ? el("ul", {id: "checkpoints"}, answer.checkpoints.map((c) =>
      el("li", {}, `step ${c.step}: `, el("code", {}, c.path), c.available ? "" : " (no longer stored)")))
      : el("p", {class: "muted"}, "No checkpoints."),
    button);
}

// Built once (a refresh would wipe its message); update(job) keeps it enabled only while the job can stop.
function cancelControl(jobId, onAuthError) {
  const message = el("span", {id: "cancel-message", role: "status"});
  const button = el("button", {type: "button", id: "cancel", class: "danger"}, "Cancel job");
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      await api.post(`/v1/jobs/${encodeURIComponent(jobId)}/cancel`);
      message.textContent = "Cancel requested.";
      message.className = "";
    } catch (err) {
      if (err instanceof AuthError && err.status === 401) return onAuthError(err);
      message.textContent = err.message;  // a 403 (read-only token) or a 409 (already ended) is said here
      message.className = "error";
      button.disabled = false;
    }
  });
  return {
    node: el("p", {}, button, " ", message),
    update: (job) => { button.disabled = TERMINAL.has(job.state) || job.cancel_requested; },
  };
}

export async function jobPage(app, jobId, onAuthError) {
  const id = encodeURIComponent(jobId);
  let job = await api.get(`/v1/jobs/${id}`);
  const pipelined = job.spec && job.spec.parallel && job.spec.parallel.pp > 1;
  const title = el("h1", {id: "job-name"}, job.name);
  const factsBox = el("div", {});
  const cancel = cancelControl(job.id, onAuthError);
  const head = el("div", {class: "job-head"}, title, el("p", {class: "muted"}, `job ${job.id}`), factsBox, cancel.node);
  const chartsBox = el("div", {});
  const timelineBox = el("div", {id: "timeline"});
  const heatField = el("select", {id: "heat-field", "aria-label": "per-rank time"},
    el("option", {value: "rank_step_time_s"}, "step time"), el("option", {value: "rank_compute_time_s"}, "compute time"));
  const heatBox = el("div", {id: "heatmap"});
  const eventsBox = el("div", {});
  const memoryBox = el("div", {id: "memory"});
  // Asked once (the layout's prediction does not change) and drawn when it comes: the planner may take a
  // few seconds on a service's first plan, and the rest of the page does not wait for it.
  let predicted;
  const drawMemory = () => clear(memoryBox).append(memoryBars(measuredPeaks(job, points), predicted));
  const checkpointsBox = el("div", {});
  const logs = logsPanel(job, onAuthError);
  app.append(...[el("p", {}, el("a", {href: "/ui"}, "← Jobs")), head,
    section("Charts", chartsBox),
    pipelined ? section("Pipeline timeline", timelineBox) : null,
    section("Step time per rank", el("div", {class: "filters"}, heatField), heatBox),
    section("Peak memory per rank", memoryBox),
    section("Events", eventsBox), section("Logs", logs.node), section("Checkpoints and model", checkpointsBox),
    section("Spec", el("pre", {id: "spec", class: "spec", tabindex: "0", "aria-label": "spec"},
                       dump(job.spec || {})))].filter(Boolean));

  let points = [], events = [], metrics = {};
  let drawnMs = null;  // when the charts were first in the page, in ms since its navigation began
  const drawHeat = () => clear(heatBox).append(rankHeatmap(points, events, heatField.value));
  heatField.addEventListener("change", drawHeat);
  let first = true;
  const poller = new Poller(async () => {
    const after = points.length ? points[points.length - 1].step : 0;
    const lastEvent = events.length ? events[events.length - 1].id : 0;
    // The page's first read of the job is fresh enough for its first tick; the three reads go together.
    let newEvents;
    [job, metrics, newEvents] = await Promise.all([
      first ? job : api.get(`/v1/jobs/${id}`), metricsAfter(id, after),
      api.get(`/v1/jobs/${id}/events?after=${lastEvent}`).then((a) => a.events)]);
    points = points.concat(metrics.points);
    events = events.concat(newEvents);
    redraw(factsBox, facts(job));
    cancel.update(job);
    redraw(chartsBox, charts(job, points, events));
    drawnMs ??= Math.round(performance.now());
    chartsBox.firstElementChild.setAttribute("data-drawn-ms", drawnMs);  // the "charts drawn" marker tests wait for
    if (pipelined) {
      const summary = (job.summary && job.summary.pipeline) || {};
      const measured = summary.bubble_fraction ?? meanOf(points, "bubble_fraction");
      const theoretical = metrics.bubble_fraction_theoretical ?? summary.bubble_fraction_theoretical;
      clear(timelineBox).append(pipelineTimeline(points, measured, theoretical));
    }
    drawHeat();
    drawMemory();
    redraw(eventsBox, eventList(events));
    if (first) {
      first = false;
      // After the charts: the planner's first answer can take seconds and must not delay them.
      predictedPeak(job).then((bytes) => { predicted = bytes; drawMemory(); });
    }
    redraw(checkpointsBox, checkpointsView(job, await api.get(`/v1/jobs/${id}/checkpoints`)));
    if (TERMINAL.has(job.state)) poller.stop();
  }, onAuthError);
  poller.start();
}

function meanOf(points, field) {
  const values = points.map((p) => p[field]).filter((v) => typeof v === "number");
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}

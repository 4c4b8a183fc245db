// The compare page (/ui/compare?jobs=ID,ID,...): the jobs' loss curves overlaid on one step axis,
// a sweep's runs side by side. The jobs page links here with the jobs ticked in its list.

import {api, AuthError} from "./api.js";
import {el} from "./dom.js";
import {lineChart, seriesOf} from "./chart.js";

const MAX_JOBS = 6;

export async function comparePage(app) {
  const ids = (new URLSearchParams(location.search).get("jobs") || "").split(",").filter(Boolean).slice(0, MAX_JOBS);
  app.append(el("p", {}, el("a", {href: "/ui"}, "← Jobs")), el("h1", {}, "Compare loss curves"));
  if (ids.length < 2) {
    app.append(el("p", {class: "muted"}, "Tick two or more jobs in the jobs list, then press Compare."));
    return;
  }
  const series = [], missing = [];
  for (const [i, id] of ids.entries()) {
    try {
      const job = await api.get(`/v1/jobs/${encodeURIComponent(id)}`);
      const metrics = await api.get(`/v1/jobs/${encodeURIComponent(id)}/metrics`);
      series.push({name: `${job.name} (${job.id})`, points: seriesOf(metrics.points, "loss"), cls: `series-${i}`});
    } catch (err) {
      if (err instanceof AuthError) throw err;
      missing.push(`${id}: ${err.message}`);
    }
  }
  app.append(el("section", {class: "panel", id: "compare"}, lineChart("loss of the compared jobs", series)),
             ...missing.map((m) => el("p", {class: "error"}, m)));
}

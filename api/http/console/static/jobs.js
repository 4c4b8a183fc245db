// The jobs page: every job of the token's tenant, filtered by state and name, refreshed every ~3 s.

import {api} from "./api.js";
import {clear, duration, el, fmt} from "./dom.js";
import {Poller} from "./poller.js";

export const STATES = ["QUEUED", "STARTING", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED", "CANCELLED"];

function jobRow(job, picked) {
  const box = el("input", {type: "checkbox", class: "pick", "aria-label": `compare ${job.name}`,
                           checked: picked.has(job.id)});
  box.addEventListener("change", () => { if (box.checked) picked.add(job.id); else picked.delete(job.id); });
  const total = job.total_steps || 0;
  const progress = el("progress", {max: total || 1, value: Math.min(job.step || 0, total || 1),
                                   "aria-label": `progress of ${job.name}`});
  return el("tr", {"data-job": job.id},
    el("td", {}, box),
    el("td", {}, el("a", {href: `/ui/jobs/${encodeURIComponent(job.id)}`, class: "job-name"}, job.name)),
    el("td", {}, el("span", {class: `state state-${job.state}`}, job.state)),
    el("td", {class: "progress"}, progress, el("span", {class: "num"}, ` ${job.step}/${total}`)),
    el("td", {class: "num"}, duration(job.eta_s)),
    el("td", {class: "num"}, fmt(job.samples_per_s)),
    el("td", {class: "num"}, fmt(job.loss)),
    el("td", {class: "num"}, String(job.restarts ?? 0)),
    el("td", {}, job.created_at ? new Date(job.created_at).toLocaleString() : "–"));
}

export async function jobsPage(app, onAuthError) {
  const stateSelect = el("select", {id: "state-filter", "aria-label": "state"},
    el("option", {value: ""}, "all states"), STATES.map((s) => el("option", {value: s}, s)));
  const nameInput = el("input", {id: "name-filter", type: "search", placeholder: "name contains…",
                                 "aria-label": "name"});
  const body = el("tbody", {id: "jobs"});
  const status = el("p", {class: "muted", id: "jobs-status"});
  const picked = new Set();  // ticked for the compare page; kept across refreshes
  const compare = el("button", {type: "button", id: "compare-button"}, "Compare ticked jobs");
  compare.addEventListener("click", () => {
    location.assign(`/ui/compare?jobs=${[...picked].map(encodeURIComponent).join(",")}`);
  });
  app.append(el("h1", {}, "Jobs"),
    el("div", {class: "filters"}, stateSelect, nameInput, compare),
    el("table", {class: "jobs"},
      el("thead", {}, el("tr", {}, ["", "Name", "State", "Progress", "ETA", "Samples/s", "Loss", "Restarts", "Created"]
        .map((h) => el("th", {scope: "col"}, h)))),
      body),
    status);

  let jobs = [];
  const draw = () => {
    const needle = nameInput.value.trim().toLowerCase();
    const shown = jobs.filter((j) => !needle || j.name.toLowerCase().includes(needle));
    clear(body).append(...shown.map((j) => jobRow(j, picked)));
    status.textContent = shown.length ? `${shown.length} job(s), refreshed ${new Date().toLocaleTimeString()}`
                                      : "No jobs match.";
  };
  const poller = new Poller(async () => {
    const state = stateSelect.value;
    const answer = await api.get(`/v1/jobs?limit=200${state ? `&state=${state}` : ""}`);
    jobs = answer.jobs;
    draw();
  }, onAuthError);
  stateSelect.addEventListener("change", () => { poller.pause(); poller.resume(); });
  nameInput.addEventListener("input", draw);
  poller.start();
}

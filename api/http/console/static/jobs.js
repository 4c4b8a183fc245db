// The jobs page: every job of the token's tenant (an admin picks any tenant), filtered by state and name,
// refreshed every ~3 s.

import {api, AuthError, token} from "./api.js";
import {duration, el, fmt, redraw} from "./dom.js";
import {Poller} from "./poller.js";

export const STATES = ["QUEUED", "STARTING", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED", "CANCELLED"];

function jobRow(job, picked) {
  const box = el("input", {type: "checkbox", class: "pick", "aria-label": `compare ${job.name}`,
                           checked: picked.has(job.id), "data-key": `pick:${job.id}`});
  box.addEventListener("change", () => { if (box.checked) picked.add(job.id); else picked.delete(job.id); });
  const total = job.total_steps || 0;
  const progress = el("progress", {max: total || 1, value: Math.min(job.step || 0, total || 1),
                                   "aria-label": `progress of ${job.name}`});
  return el("tr", {"data-job": job.id},
    el("td", {}, box),
    el("td", {}, el("a", {href: `/ui/jobs/${encodeURIComponent(job.id)}`, class: "job-name",
                          "data-key": `link:${job.id}`}, job.name)),
    el("td", {}, el("span", {class: `state state-${job.state}`}, job.state)),
    el("td", {class: "progress"}, progress, el("span", {class: "num"}, ` ${job.step}/${total}`)),
    el("td", {class: "num"}, duration(job.eta_s)),
    el("td", {class: "num"}, fmt(job.samples_per_s)),
    el("td", {class: "num"}, fmt(job.loss)),
    el("td", {class: "num"}, String(job.restarts ?? 0)),
    el("td", {}, job.created_at ? new Date(job.created_at).toLocaleString() : "–"));
}

// The tenants an admin token may list jobs of, or null for any other token. Admin-ness is learnt from
// GET /v1/tenants (admin scope): an admin's token reads it, any other is refused with a 403. The refusal
// is remembered for the tab's token (api.js forgets it with the token), so it is asked once, not per page.
const NOT_ADMIN = "trainyard.not-admin";

async function adminTenants() {
  if (sessionStorage.getItem(NOT_ADMIN) === token.get()) return null;
  try {
    return (await api.get("/v1/tenants")).tenants;
  } catch (err) {
    if (err instanceof AuthError && err.status === 403) {
      sessionStorage.setItem(NOT_ADMIN, token.get() || "");
      return null;
    }
    throw err;  // a 401 is the page's to answer
  }
}

function tenantFilter(tenants, chosen) {
  const select = el("select", {id: "tenant-filter", "aria-label": "tenant"},
    el("option", {value: ""}, "this token's tenant"),
    tenants.map((t) => el("option", {value: t.id, "data-name": t.name}, t.name)));
  select.value = tenants.some((t) => t.id === chosen) ? chosen : "";
  return select;
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
  const filters = el("div", {class: "filters"}, stateSelect, nameInput, compare);
  app.append(el("h1", {}, "Jobs"), filters,
    el("table", {class: "jobs"},
      el("thead", {}, el("tr", {}, ["", "Name", "State", "Progress", "ETA", "Samples/s", "Loss", "Restarts", "Created"]
        .map((h) => el("th", {scope: "col"}, h)))),
      body),
    status);

  // ?tenant=ID in the page's address (an admin's choice, kept across reloads and in links).
  let tenant = new URLSearchParams(location.search).get("tenant") || "";
  let tenantName = "";
  let jobs = [];
  const draw = () => {
    const needle = nameInput.value.trim().toLowerCase();
    const shown = jobs.filter((j) => !needle || j.name.toLowerCase().includes(needle));
    redraw(body, shown.map((j) => jobRow(j, picked)));
    const whose = tenant ? ` of tenant ${tenantName || tenant}` : "";
    status.textContent = shown.length ? `${shown.length} job(s)${whose}, refreshed ${new Date().toLocaleTimeString()}`
                                      : `No jobs match${whose}.`;
  };
  const poller = new Poller(async () => {
    const state = stateSelect.value;
    const query = `limit=200${state ? `&state=${state}` : ""}${tenant ? `&tenant=${encodeURIComponent(tenant)}` : ""}`;
    const answer = await api.get(`/v1/jobs?${query}`);
    jobs = answer.jobs;
    draw();
  }, onAuthError);
  const reload = () => { poller.pause(); poller.resume(); };
  stateSelect.addEventListener("change", reload);
  nameInput.addEventListener("input", draw);

  const tenants = await adminTenants();
  if (tenants) {
    const select = tenantFilter(tenants, tenant);
    const pick = () => {
      tenant = select.value;
      tenantName = tenant ? select.selectedOptions[0].dataset.name : "";
    };
    pick();
    select.addEventListener("change", () => {
      pick();
      const params = new URLSearchParams(location.search);
      if (tenant) params.set("tenant", tenant); else params.delete("tenant");
      const query = params.toString();
      history.replaceState(null, "", `${location.pathname}${query ? `?${query}` : ""}`);
      reload();
    });
    stateSelect.before(select);
  } else {
    tenant = "";  // a tenant's token lists its own jobs, whatever the address says
  }
  poller.start();
}

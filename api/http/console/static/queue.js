// The queue and cluster page: each tenant's fair share, running workers, queued jobs and reservation
// (GET /v1/queue), and the nodes with their free resources (GET /v1/cluster).

import {api, ApiError} from "./api.js";
import {el, fmt, section} from "./dom.js";
import {Poller} from "./poller.js";

function resources(r) {
  return Object.entries(r || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ") || "–";
}

function queueView(q) {
  return el("div", {},
    el("p", {class: "muted"}, `A job waiting longer than ${fmt(q.reserve_after_s)} s reserves workers.`),
    el("table", {id: "queue"},
      el("thead", {}, el("tr", {}, ["Tenant", "Weight", "Fair share", "Running workers", "Queued", "Reservation"]
        .map((h) => el("th", {scope: "col"}, h)))),
      el("tbody", {}, q.tenants.map((t) => el("tr", {},
        el("td", {}, t.tenant), el("td", {class: "num"}, fmt(t.weight)), el("td", {class: "num"}, fmt(t.fair_share)),
        el("td", {class: "num"}, fmt(t.running_workers)), el("td", {class: "num"}, fmt(t.queued)),
        el("td", {}, t.reservation ? `${t.reservation.workers} workers for ${t.reservation.job}` : "–"))))));
}

function clusterView(c) {
  return el("div", {},
    el("p", {}, `Total: ${resources(c.total)} · free: ${resources(c.free)}`),
    el("table", {id: "nodes"},
      el("thead", {}, el("tr", {}, ["Node", "Alive", "Total", "Free"].map((h) => el("th", {scope: "col"}, h)))),
      el("tbody", {}, c.nodes.map((n) => el("tr", {},
        el("td", {}, el("code", {}, n.node)), el("td", {}, n.alive ? "yes" : "no"),
        el("td", {}, resources(n.total)), el("td", {}, resources(n.free)))))));
}

// One endpoint's panel: its view, or the refusal's message in its place.
async function fill(box, path, view) {
  try {
    box.replaceChildren(view(await api.get(path)));
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    box.replaceChildren(el("p", {class: "muted missing"}, `${path}: ${err.message}`));
  }
}

export async function queuePage(app, onAuthError) {
  const queueBox = el("div", {id: "queue-box"});
  const clusterBox = el("div", {id: "cluster-box"});
  app.append(el("h1", {}, "Queue and cluster"), section("Queue by tenant", queueBox), section("Nodes", clusterBox));
  new Poller(async () => {
    await fill(queueBox, "/v1/queue", queueView);
    await fill(clusterBox, "/v1/cluster", clusterView);
  }, onAuthError).start();
}

// A job's logs per rank (or its supervisor's), the last lines, or followed as the service streams them.

import {AuthError, token} from "./api.js";
import {el} from "./dom.js";

const TAIL = 500;
const MAX_CHARS = 400_000;  // a followed log keeps its newest part only, so the page stays light

export function logsPanel(job, onAuthError) {
  const rank = el("select", {id: "log-rank", "aria-label": "rank"},
    el("option", {value: "supervisor"}, "supervisor"),
    Array.from({length: job.world_size || 1}, (_, r) => el("option", {value: String(r)}, `rank ${r}`)));
  rank.value = "0";
  const follow = el("input", {type: "checkbox", id: "log-follow"});
  const pre = el("pre", {id: "log-text", class: "log", tabindex: "0"});
  const status = el("span", {class: "muted", id: "log-status"});
  let controller = null;

  async function load() {
    if (controller) controller.abort();
    controller = new AbortController();
    const mine = controller;
    const url = `/v1/jobs/${encodeURIComponent(job.id)}/logs?rank=${rank.value}&tail=${TAIL}` +
                (follow.checked ? "&follow=true" : "");
    pre.textContent = "";
    status.textContent = follow.checked ? "following…" : "";
    try {
      const resp = await fetch(url, {headers: {"Authorization": `Bearer ${token.get() || ""}`}, signal: mine.signal});
      if (resp.status === 401 || resp.status === 403) {
        throw new AuthError(resp.status, resp.status === 401 ? "The token was refused (401). Log in again."
                                                             : "This token may not read logs (403).");
      }
      if (!resp.ok) { status.textContent = `logs: HTTP ${resp.status}`; return; }
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        if (!pre.isConnected) return mine.abort();  // the page was redrawn without this panel: stop reading
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.textContent = (pre.textContent + decoder.decode(value, {stream: true})).slice(-MAX_CHARS);
        if (atBottom || follow.checked) pre.scrollTop = pre.scrollHeight;
      }
      if (mine === controller) status.textContent = follow.checked ? "the job ended; the log is complete" : "";
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err instanceof AuthError) onAuthError(err);
      else status.textContent = `logs: ${err.message}`;
    }
  }

  rank.addEventListener("change", load);
  follow.addEventListener("change", load);
  load();
  return {
    node: el("div", {class: "logs"},
      el("div", {class: "filters"}, rank, el("label", {for: "log-follow"}, follow, " follow"), status), pre),
    stop: () => controller && controller.abort(),
  };
}

// The submit page: a YAML editor checked as the user types (the JobSpec schema from /openapi.json), the
// planner's table of layouts (POST /v1/plans), and the submission, whose 422 is shown beside its line.

import {api, ApiError, AuthError} from "./api.js";
import {clear, el, fmt} from "./dom.js";
import {check, jobSpecSchema} from "./schema_check.js";
import {parse, YamlError} from "./yaml.js";

const STARTER = `name: my-job
model: {name: gpt, n_layers: 2, d_model: 64, n_heads: 2, seq_len: 32}
data: {name: "text:pystdlib"}
train: {steps: 20, global_batch_size: 8, micro_batch_size: 4, lr: 3.0e-3}
parallel: {dp: 1}
resources: {workers: 1, cpus_per_worker: 1}
`;

// The line a dotted field stands on, or that of its nearest parent the editor has ("train.steps" -> "train").
function lineOf(lines, field) {
  const parts = String(field || "").split(".");
  while (parts.length) {
    const line = lines.get(parts.join("."));
    if (line) return line;
    parts.pop();
  }
  return 1;
}

function mib(bytes) {
  return typeof bytes === "number" ? `${(bytes / 2 ** 20).toFixed(1)} MiB` : "–";
}

function planTable(plan) {
  const chosen = plan.chosen ? JSON.stringify(plan.chosen.parallel) : null;
  return el("div", {},
    plan.explanation ? el("p", {class: "muted"}, plan.explanation) : null,
    el("table", {id: "plan", class: "plan"},
      el("thead", {}, el("tr", {}, ["Layout", "Strategy", "Predicted peak / rank", "Step cost s", "Comm / step", "Fits"]
        .map((h) => el("th", {scope: "col"}, h)))),
      el("tbody", {}, plan.candidates.map((c) => {
        const layout = JSON.stringify(c.parallel);
        return el("tr", {class: layout === chosen ? "chosen" : null},
          el("td", {}, el("code", {}, layout), layout === chosen ? " ← auto" : ""), el("td", {}, c.strategy),
          el("td", {class: "num"}, mib(c.memory_bytes_per_rank)), el("td", {class: "num"}, fmt(c.predicted_step_s)),
          el("td", {class: "num"}, mib(c.comm_bytes_per_step)), el("td", {}, c.fits ? "yes" : `no ${c.note || ""}`));
      }))));
}

export async function submitPage(app, onAuthError) {
  const schema = jobSpecSchema(await api.get("/openapi.json"));
  const editor = el("textarea", {id: "spec-editor", spellcheck: "false", rows: 24, cols: 80, "aria-label": "job spec (YAML)"});
  editor.value = sessionStorage.getItem("trainyard.draft") || STARTER;
  const errors = el("ol", {id: "spec-errors", class: "spec-errors", "aria-live": "polite"});
  const status = el("p", {id: "submit-status", role: "status"});
  const planBox = el("div", {id: "plan-box"});
  const planButton = el("button", {type: "button", id: "plan-button"}, "Plan layouts");
  const submitButton = el("button", {type: "button", id: "submit-button", class: "primary"}, "Submit");
  app.append(el("h1", {}, "Submit a job"),
    el("div", {class: "editor"}, el("div", {}, editor), el("aside", {}, el("h2", {}, "Problems"), errors)),
    el("p", {}, planButton, " ", submitButton), status, planBox);

  // Problems as {line, field, message}, listed beside the editor, each with its line.
  const show = (problems) => {
    clear(errors).append(...problems.map((p) => el("li", {"data-line": p.line, "data-field": p.field || ""},
      el("span", {class: "line-no"}, `line ${p.line}`), " ", p.message)));
    if (!problems.length) errors.append(el("li", {class: "ok"}, "No problems found."));
  };

  // The spec as an object, or null with the problems shown.
  const checked = () => {
    sessionStorage.setItem("trainyard.draft", editor.value);
    let doc;
    try {
      doc = parse(editor.value);
    } catch (err) {
      if (!(err instanceof YamlError)) throw err;
      show([{line: err.line, field: "", message: err.message.replace(/^line \d+: /, "")}]);
      return null;
    }
    const problems = check(doc.value, schema).map((e) => ({line: lineOf(doc.lines, e.path), field: e.path,
                                                            message: e.message}));
    show(problems);
    return problems.length ? null : doc;
  };

  const serverProblems = (err, doc) => {
    if (err instanceof AuthError) {
      if (err.status === 401) return onAuthError(err);
      status.textContent = err.message;
      return;
    }
    const list = err instanceof ApiError && err.errors.length ? err.errors : [{field: "", message: err.message}];
    show(list.map((e) => ({line: lineOf(doc.lines, e.field), field: e.field, message: e.message})));
    status.textContent = `The service refused the spec (${err.status || "error"}).`;
  };

  let timer = null;
  editor.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(checked, 250); });
  planButton.addEventListener("click", async () => {
    clearTimeout(timer);  // a pending check of the same text would hide the service's answer
    const doc = checked();
    if (!doc) return;
    status.textContent = "Planning…";
    try {
      clear(planBox).append(planTable(await api.post("/v1/plans", doc.value)));
      status.textContent = "";
    } catch (err) { serverProblems(err, doc); }
  });
  submitButton.addEventListener("click", async () => {
    clearTimeout(timer);
    const doc = checked();
    if (!doc) return;
    submitButton.disabled = true;
    status.textContent = "Submitting…";
    try {
      const job = await api.post("/v1/jobs", doc.value);
      sessionStorage.removeItem("trainyard.draft");
      location.assign(`/ui/jobs/${encodeURIComponent(job.id)}`);
    } catch (err) {
      serverProblems(err, doc);
      submitButton.disabled = false;
    }
  });
  checked();
}

// The console's entry: log in (form or #token=...), then draw the page the path names.

import {AuthError, token} from "./api.js";
import {clear, el} from "./dom.js";
import {stopAll} from "./poller.js";
import {jobsPage} from "./jobs.js";
import {jobPage} from "./job.js";
import {submitPage} from "./submit.js";
import {queuePage} from "./queue.js";
import {comparePage} from "./compare.js";

const app = document.getElementById("app");
const notice = document.getElementById("notice");
const logout = document.getElementById("logout");

// A token in the URL fragment (never sent to the server) logs in for scripted use; it leaves the URL at once.
function takeFragmentToken() {
  const match = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!match) return;
  token.set(decodeURIComponent(match[1]));
  history.replaceState(null, "", location.pathname + location.search);
}

export function showNotice(message) {
  notice.textContent = message;
  notice.hidden = !message;
}

// The page's answer to a refused token: a clear message; a 401 also forgets the token and offers the login.
export function onAuthError(err) {
  if (err.status === 401) {
    stopAll();
    token.clear();
    showLogin(err.message);
  } else {
    showNotice(err.message);
  }
}

function showLogin(message = "") {
  logout.hidden = true;
  const input = el("input", {id: "token", name: "token", type: "password", autocomplete: "off", required: true,
                             "aria-label": "API token"});
  const form = el("form", {id: "login", class: "panel"},
    el("h1", {}, "Log in"),
    el("p", {}, "Paste an API token (the same bearer token the CLI uses). It is kept in this tab only."),
    message ? el("p", {class: "error", id: "login-error", role: "alert"}, message) : null,
    el("label", {for: "token"}, "Token"), input,
    el("button", {type: "submit"}, "Log in"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    token.set(input.value.trim());
    route();
  });
  showNotice("");
  clear(app).append(form);
  input.focus();
}

async function route() {
  stopAll();
  showNotice("");
  if (!token.get()) return showLogin();
  logout.hidden = false;
  clear(app);
  const path = location.pathname.replace(/\/+$/, "");
  const job = /^\/ui\/jobs\/([^/]+)$/.exec(path);
  for (const link of document.querySelectorAll("header.top nav a")) {  // which page the nav is on
    const here = link.getAttribute("href") === (job || path === "/ui/compare" ? "/ui" : path || "/ui");
    if (here) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  try {
    if (job) await jobPage(app, decodeURIComponent(job[1]), onAuthError);
    else if (path === "/ui/submit") await submitPage(app, onAuthError);
    else if (path === "/ui/queue") await queuePage(app, onAuthError);
    else if (path === "/ui/compare") await comparePage(app);
    else await jobsPage(app, onAuthError);
  } catch (err) {
    if (err instanceof AuthError) onAuthError(err);
    else showNotice(`Could not load the page: ${err.message}`);
  }
}

logout.addEventListener("click", () => {
  stopAll();
  token.clear();
  showLogin();
});

// A new #token=... on the same page (no reload happens for a fragment) logs in with it too.
window.addEventListener("hashchange", () => {
  if (/(?:^#|&)token=/.test(location.hash)) {
    takeFragmentToken();
    route();
  }
});

takeFragmentToken();
route();

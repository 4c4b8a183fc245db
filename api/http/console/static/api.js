// The REST client: the same bearer token as the CLI, kept in this tab's sessionStorage.

const KEY = "trainyard.token";

export class AuthError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.detail) || `HTTP ${status}`);
    this.status = status;
    this.errors = (body && Array.isArray(body.errors)) ? body.errors : [];
  }
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => { sessionStorage.removeItem(KEY); sessionStorage.removeItem("trainyard.not-admin"); },
};

// What a 401 or 403 means to the person looking at the page.
function authMessage(status, detail) {
  if (status === 401) return `The token was refused (401): ${detail || "unknown or expired token"}. Log in again.`;
  return `This token may not do that (403): ${detail || "missing scope"}.`;
}

async function request(method, path, {body, text = false} = {}) {
  const headers = {"Authorization": `Bearer ${token.get() || ""}`};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  if (resp.status === 401 || resp.status === 403) {
    let detail = "";
    try { detail = (await resp.json()).detail; } catch { /* not JSON */ }
    throw new AuthError(resp.status, authMessage(resp.status, detail));
  }
  if (!resp.ok) {
    let parsed = null;
    try { parsed = await resp.json(); } catch { /* not JSON */ }
    throw new ApiError(resp.status, parsed);
  }
  return text ? resp.text() : resp.json();
}

export const api = {
  get: (path) => request("GET", path),
  text: (path) => request("GET", path, {text: true}),
  post: (path, body) => request("POST", path, {body}),
};

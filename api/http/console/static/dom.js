// Building the page: every piece of text goes in through textContent, never as markup.

const SVG_NS = "http://www.w3.org/2000/svg";

// el("td", {class: "num"}, "text", child): attributes are set one by one; children are nodes or text.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(node) {
  while (node.firstChild) node.firstChild.remove();
  return node;
}

// Redraw `box` with `nodes`, the keyboard focus staying on the same control if it was inside: a refresh
// every few seconds must not throw a keyboard user back to the top of the page. A control is found again
// by its id or its `data-key`.
export function redraw(box, ...nodes) {
  const active = document.activeElement;
  const key = active && active !== box && box.contains(active) ? focusKey(active) : null;
  clear(box).append(...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false));
  if (key) {
    const again = box.querySelector(key);
    if (again) again.focus({preventScroll: true});
  }
  return box;
}

function focusKey(node) {
  if (node.id) return `#${CSS.escape(node.id)}`;
  const key = node.getAttribute("data-key");
  return key ? `[data-key="${CSS.escape(key)}"]` : null;
}

export function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  return Math.abs(value) >= 1000 ? value.toFixed(0) : value.toPrecision(digits);
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

export function section(title, ...children) {
  return el("section", {class: "panel"}, el("h2", {}, title), ...children);
}

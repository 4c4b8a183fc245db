// The YAML a job spec is written in: block and flow mappings and lists, plain and quoted scalars,
// comments. parse() also says on which line each key stands, so an error can be shown beside it.

export class YamlError extends Error {
  constructor(message, line) {
    super(`line ${line}: ${message}`);
    this.line = line;
  }
}

const SCALARS = {"null": null, "~": null, "true": true, "false": false, "True": true, "False": false};

function scalar(text, line) {
  const t = text.trim();
  if (t === "") return null;
  if (t in SCALARS) return SCALARS[t];
  if (/^[-+]?(\d[\d_]*)$/.test(t)) return Number(t.replace(/_/g, ""));
  if (/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(t)) return Number(t);
  if (t.startsWith('"')) {
    try { return JSON.parse(t); } catch { throw new YamlError(`bad double-quoted string ${t}`, line); }
  }
  if (t.startsWith("'")) {
    if (!t.endsWith("'") || t.length < 2) throw new YamlError(`unclosed single-quoted string ${t}`, line);
    return t.slice(1, -1).replace(/''/g, "'");
  }
  return t;
}

// A comment starts at a # at the line's start or after a space, outside quotes.
function stripComment(text) {
  let quote = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quote) { if (c === quote) quote = null; continue; }
    if (c === '"' || c === "'") quote = c;
    else if (c === "#" && (i === 0 || /\s/.test(text[i - 1]))) return text.slice(0, i);
  }
  return text;
}

// One flow value ({...}, [...] or a scalar) from text, starting at pos.
function flow(text, line, path, lines) {
  let pos = 0;
  const ws = () => { while (pos < text.length && /\s/.test(text[pos])) pos++; };
  const plain = (stops) => {
    const start = pos;
    if (text[pos] === '"' || text[pos] === "'") {
      const q = text[pos++];
      while (pos < text.length && text[pos] !== q) pos += text[pos] === "\\" && q === '"' ? 2 : 1;
      pos++;
    } else {
      while (pos < text.length && !stops.includes(text[pos]) && !(text[pos] === ":" && /\s/.test(text[pos + 1] || " ")))
        pos++;
    }
    return text.slice(start, pos);
  };
  const value = (at) => {
    ws();
    if (text[pos] === "{") {
      pos++;
      const out = {};
      for (ws(); text[pos] !== "}"; ws()) {
        if (pos >= text.length) throw new YamlError("unclosed {", line);
        const key = String(scalar(plain(",}:"), line));
        ws();
        if (text[pos] !== ":") throw new YamlError(`expected ':' after ${key}`, line);
        pos++;
        lines.set(at ? `${at}.${key}` : key, line);
        out[key] = value(at ? `${at}.${key}` : key);
        ws();
        if (text[pos] === ",") pos++;
        else if (text[pos] !== "}") throw new YamlError(`expected ',' or '}' after ${key}`, line);
      }
      pos++;
      return out;
    }
    if (text[pos] === "[") {
      pos++;
      const out = [];
      for (ws(); text[pos] !== "]"; ws()) {
        if (pos >= text.length) throw new YamlError("unclosed [", line);
        out.push(value(`${at}.${out.length}`));
        ws();
        if (text[pos] === ",") pos++;
        else if (text[pos] !== "]") throw new YamlError("expected ',' or ']'", line);
      }
      pos++;
      return out;
    }
    return scalar(plain(",]}"), line);
  };
  const result = value(path);
  ws();
  if (pos < text.length) throw new YamlError(`unexpected ${JSON.stringify(text.slice(pos))}`, line);
  return result;
}

function depth(text) {
  let open = 0, quote = null;
  for (const c of text) {
    if (quote) { if (c === quote) quote = null; continue; }
    if (c === '"' || c === "'") quote = c;
    else if (c === "{" || c === "[") open++;
    else if (c === "}" || c === "]") open--;
  }
  return open;
}

const KEY = /^("(?:[^"\\]|\\.)*"|'[^']*'|[^\s"'#\-[{][^:]*?|-[^\s:][^:]*?)\s*:(?:\s+(.*))?$/;

// -> {value, lines: Map(dotted path -> 1-based line)}. Throws YamlError with the line.
export function parse(source) {
  const rows = [];
  const raw = source.split(/\r?\n/);
  for (let i = 0; i < raw.length; i++) {
    let text = stripComment(raw[i]).replace(/\s+$/, "");
    if (!text.trim()) continue;
    if (/\t/.test(text.match(/^\s*/)[0])) throw new YamlError("tabs are not allowed for indentation", i + 1);
    const line = i + 1;
    while (depth(text) > 0 && i + 1 < raw.length) text += " " + stripComment(raw[++i]).trim();  // a flow value over lines
    rows.push({indent: text.match(/^ */)[0].length, text: text.trim(), line});
  }
  const lines = new Map();
  if (!rows.length) return {value: null, lines};
  const at = (path, key) => (path ? `${path}.${key}` : String(key));
  const isItem = (row) => row.text === "-" || row.text.startsWith("- ");

  function node(i, indent, path) {
    return isItem(rows[i]) ? sequence(i, indent, path) : mapping(i, indent, path);
  }

  function child(i, row, path) {  // the value of `key:` with nothing after it on its line
    const next = rows[i + 1];
    if (next && (next.indent > row.indent || (next.indent === row.indent && isItem(next) && !isItem(row))))
      return node(i + 1, next.indent, path);
    return [null, i + 1];
  }

  function mapping(i, indent, path) {
    const out = {};
    while (i < rows.length && rows[i].indent === indent && !isItem(rows[i])) {
      const row = rows[i];
      const m = KEY.exec(row.text);
      if (!m) {
        if (i === 0 && indent === 0 && !path) return [flow(row.text, row.line, "", lines), i + 1];
        throw new YamlError(`expected 'key: value', got ${JSON.stringify(row.text)}`, row.line);
      }
      const key = String(scalar(m[1], row.line));
      if (Object.hasOwn(out, key)) throw new YamlError(`duplicate key ${key}`, row.line);
      lines.set(at(path, key), row.line);
      if (m[2] === undefined || m[2] === "") [out[key], i] = child(i, row, at(path, key));
      else [out[key], i] = [flow(m[2], row.line, at(path, key), lines), i + 1];
    }
    if (i < rows.length && rows[i].indent > indent)
      throw new YamlError("unexpected indentation", rows[i].line);
    return [out, i];
  }

  function sequence(i, indent, path) {
    const out = [];
    while (i < rows.length && rows[i].indent === indent && isItem(rows[i])) {
      const row = rows[i];
      const rest = row.text.slice(1).trimStart();
      const itemPath = at(path, out.length);
      lines.set(itemPath, row.line);
      let value;
      if (!rest) [value, i] = child(i, row, itemPath);
      else if (KEY.test(rest) && !/^[[{"']/.test(rest)) {  // "- key: value": a mapping indented past the dash
        rows[i] = {indent: indent + (row.text.length - rest.length), text: rest, line: row.line};
        [value, i] = mapping(i, rows[i].indent, itemPath);
      } else [value, i] = [flow(rest, row.line, itemPath, lines), i + 1];
      out.push(value);
    }
    return [out, i];
  }

  const [value, end] = node(0, rows[0].indent, "");
  if (end < rows.length) throw new YamlError("unexpected indentation", rows[end].line);
  return {value, lines};
}

function dumpScalar(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v !== "string") return String(v);
  const plainOk = /^[A-Za-z_./][\w./:@+-]*$/.test(v) && !(v in SCALARS) && !/:\s|:$/.test(v);
  return plainOk ? v : JSON.stringify(v);
}

const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

// A spec as block YAML (lists of scalars inline), for the job page.
export function dump(value, indent = 0) {
  const pad = " ".repeat(indent);
  if (isObj(value)) {
    return Object.entries(value).map(([k, v]) => {
      if (isObj(v) && Object.keys(v).length) return `${pad}${dumpScalar(k)}:\n${dump(v, indent + 2)}`;
      if (Array.isArray(v) && v.some((x) => isObj(x) || Array.isArray(x)))
        return `${pad}${dumpScalar(k)}:\n${dump(v, indent + 2)}`;
      return `${pad}${dumpScalar(k)}: ${inline(v)}`;
    }).join("\n");
  }
  if (Array.isArray(value)) {
    return value.map((v) => {
      if (isObj(v)) return `${pad}- ${dump(v, indent + 2).trimStart()}`;
      return `${pad}- ${inline(v)}`;
    }).join("\n");
  }
  return pad + dumpScalar(value);
}

function inline(v) {
  if (Array.isArray(v)) return `[${v.map(inline).join(", ")}]`;
  if (isObj(v)) return `{${Object.entries(v).map(([k, x]) => `${dumpScalar(k)}: ${inline(x)}`).join(", ")}}`;
  return dumpScalar(v);
}

// A small JSON Schema checker for the JobSpec schema the API publishes (/openapi.json): types, enums,
// required and unknown keys, bounds, patterns, $ref and anyOf/oneOf. The server's check is the final word;
// this one points at the line while the user types.

const TYPES = {
  object: (v) => v !== null && typeof v === "object" && !Array.isArray(v),
  array: Array.isArray,
  string: (v) => typeof v === "string",
  integer: Number.isInteger,
  number: (v) => typeof v === "number",
  boolean: (v) => typeof v === "boolean",
  null: (v) => v === null,
};

// The request body's schema of POST /v1/jobs and a resolver for its $refs ("#/$defs/X" or components).
export function jobSpecSchema(openapi) {
  const schema = openapi.paths["/v1/jobs"].post.requestBody.content["application/json"].schema;
  const defs = {...(openapi.components && openapi.components.schemas), ...(schema.$defs || {})};
  return {schema, resolve: (ref) => defs[ref.split("/").pop()]};
}

// -> [{path: "train.steps", message}], empty when the value fits.
export function check(value, {schema, resolve}) {
  const errors = [];
  walk(value, schema, "", errors, resolve);
  return errors;
}

function label(path) {
  return path || "spec";
}

function walk(v, s, path, errors, resolve) {
  if (!s) return;
  if (s.$ref) return walk(v, resolve(s.$ref), path, errors, resolve);
  const variants = s.anyOf || s.oneOf;
  if (variants) {
    // Fits one variant: fine. Else the closest variant's complaints (the fewest), which name the real slip.
    let best = null;
    for (const variant of variants) {
      const found = [];
      walk(v, variant, path, found, resolve);
      if (!found.length) return;
      if (!best || found.length < best.length) best = found;
    }
    errors.push(...best);
    return;
  }
  if (s.type) {
    const types = Array.isArray(s.type) ? s.type : [s.type];
    if (!types.some((t) => TYPES[t] && TYPES[t](v))) {
      errors.push({path, message: `${label(path)}: must be ${types.join(" or ")}, got ${JSON.stringify(v)}`});
      return;
    }
  }
  if (s.const !== undefined && v !== s.const)
    errors.push({path, message: `${label(path)}: must be ${JSON.stringify(s.const)}`});
  if (s.enum && !s.enum.includes(v))
    errors.push({path, message: `${label(path)}: must be one of ${s.enum.join(", ")} (got ${JSON.stringify(v)})`});
  if (typeof v === "number") {
    if (s.minimum !== undefined && v < s.minimum) errors.push({path, message: `${label(path)}: must be ≥ ${s.minimum}`});
    if (s.maximum !== undefined && v > s.maximum) errors.push({path, message: `${label(path)}: must be ≤ ${s.maximum}`});
    if (s.exclusiveMinimum !== undefined && v <= s.exclusiveMinimum)
      errors.push({path, message: `${label(path)}: must be > ${s.exclusiveMinimum}`});
  }
  if (typeof v === "string" && s.pattern && !new RegExp(s.pattern, "u").test(v))
    errors.push({path, message: `${label(path)}: must match ${s.pattern} (got ${JSON.stringify(v)})`});
  if (TYPES.array(v) && s.items) v.forEach((item, i) => walk(item, s.items, `${path}.${i}`, errors, resolve));
  if (TYPES.object(v) && (s.properties || s.required || s.additionalProperties !== undefined)) {
    const props = s.properties || {};
    for (const key of s.required || []) {
      if (!(key in v)) errors.push({path: path || key, message: `${path ? path + "." : ""}${key}: required`});
    }
    for (const [key, item] of Object.entries(v)) {
      const at = path ? `${path}.${key}` : key;
      if (props[key]) walk(item, props[key], at, errors, resolve);
      else if (s.additionalProperties === false) {
        errors.push({path: at, message: `${at}: unknown key (known: ${Object.keys(props).join(", ")})`});
      } else if (typeof s.additionalProperties === "object") walk(item, s.additionalProperties, at, errors, resolve);
    }
  }
}

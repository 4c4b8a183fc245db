"""docs/spec.md, the job spec reference, generated from JobSpec's JSON schema.

Every key appears as its dotted path with its type, default, allowed values and the description the
schema itself carries, one section of the spec (model, data, train, ...) after another. The page is
never edited by hand: `make spec-reference` (python -m workers.spec.reference) rewrites it, `--check`
only says whether it is stale, and tests/workers/test_spec_reference.py fails when it is.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.spec.job import JobSpec

PAGE = Path(__file__).resolve().parents[2] / "docs" / "spec.md"
COMMAND = "make spec-reference"  # or: python -m workers.spec.reference

INTRO = f"""\
# Job spec reference

This page is generated from the job spec's schema, the pydantic models in `workers/spec/`, by
`{COMMAND}` (`python -m workers.spec.reference`): change a key's description there and
regenerate, never edit this page by hand (tests/workers/test_spec_reference.py fails when it is
stale). A spec is one YAML or JSON mapping. Every key is optional unless its default reads
*required* (inside an optional mapping: required when that mapping is given), and an unknown key is
refused. The rules that span several keys (for example dp x tp x pp = resources.workers) are checked
when a spec is validated, `trainyard validate SPEC`, and the descriptions below name them;
`trainyard schema` prints the same schema as JSON Schema.
"""

Schema = dict[str, Any]


@dataclass(frozen=True)
class Row:
    path: str
    type: str
    default: str
    allowed: str
    description: str


class Walker:
    """Reads JobSpec's JSON schema: the properties of a mapping, each one's type, default and bounds."""

    def __init__(self, schema: Schema):
        self.root, self.defs = schema, schema.get("$defs", {})

    def deref(self, s: Schema) -> Schema:
        return self.defs[s["$ref"].rsplit("/", 1)[-1]] if "$ref" in s else s

    def mappings(self, prop: Schema) -> tuple[str, list[Schema]]:
        """The mapping schemas a property holds (one, several for a union, none for a scalar) and the
        path suffix of their keys ("[]" for a list of mappings)."""
        if prop.get("type") == "array" and "items" in prop:
            return "[]", self.mappings(prop["items"])[1]
        if "$ref" in prop:
            return "", [self.deref(prop)]
        branches = prop.get("oneOf") or prop.get("anyOf") or []
        return "", [self.deref(b) for b in branches if "$ref" in b]

    def rows(self, mapping: Schema, prefix: str) -> Iterator[Row]:
        required = set(mapping.get("required", ()))
        for key, prop in mapping.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            suffix, children = self.mappings(prop)
            yield Row(path, self.type_of(prop), default_of(prop, key in required, bool(children)),
                      allowed_of(prop), prop.get("description", ""))
            for child in children:
                yield from self.rows(child, path + suffix)

    def type_of(self, s: Schema) -> str:
        if "$ref" in s:
            return "mapping"
        if "oneOf" in s or "anyOf" in s:
            kinds = [self.type_of(b) for b in s.get("oneOf") or s["anyOf"]]
            return " or ".join(dict.fromkeys(kinds))
        kind = s.get("type")
        if kind == "array":
            return f"list of {self.type_of(s.get('items', {}))}"
        if kind == "object":
            values = s.get("additionalProperties")
            if not isinstance(values, dict) and s.get("patternProperties"):
                values = next(iter(s["patternProperties"].values()))
            return f"mapping of string to {self.type_of(values)}" if isinstance(values, dict) else "mapping"
        return {"integer": "int", "number": "float", "boolean": "bool", "string": "string",
                "null": "null"}.get(kind or "", "any")


def default_of(prop: Schema, required: bool, has_keys: bool) -> str:
    if "default" in prop:
        return f"`{json.dumps(prop['default'])}`"
    if required:
        return "*required*"
    if has_keys:
        return "see its keys"
    return "`[]`" if prop.get("type") == "array" else "`{}`"  # a default_factory of list or dict


NUMERIC_BOUNDS = (("minimum", ">= {}"), ("exclusiveMinimum", "> {}"), ("maximum", "<= {}"),
                  ("exclusiveMaximum", "< {}"))


def bounds(s: Schema) -> list[str]:
    """A schema's bounds in words: numbers, lengths of strings and lists, a pattern."""
    parts = [text.format(s[key]) for key, text in NUMERIC_BOUNDS if key in s]
    low, high = s.get("minLength"), s.get("maxLength")
    if low and high:
        parts.append(f"{low} to {high} characters")
    elif low or high:
        parts.append("not empty" if low == 1 else f"at least {low} characters" if low else f"at most {high} characters")
    if "minItems" in s:
        parts.append("not empty" if s["minItems"] == 1 else f"at least {s['minItems']} entries")
    if "pattern" in s:
        parts.append(f"matches `{s['pattern']}`")
    return parts


def allowed_of(prop: Schema) -> str:
    """Enumerated values and bounds, of the property and of each branch of a union."""
    parts: list[str] = []
    for s in [prop, *prop.get("oneOf", ()), *prop.get("anyOf", ())]:
        parts += [f"`{json.dumps(v)}`" for v in s.get("enum", ())]
        if "const" in s:
            parts.append(f"`{json.dumps(s['const'])}`")
        parts += bounds(s)  # `null` is left out: the type says "or null"
    return ", ".join(dict.fromkeys(parts))


def cell(text: str) -> str:
    # A pipe would end the cell; `<job dir>` would read as an HTML tag (`<= 4096` would not).
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text.replace("|", "\\|").replace("\n", " "))


def table(rows: list[Row]) -> list[str]:
    out = ["| Key | Type | Default | Allowed | Description |", "|---|---|---|---|---|"]
    out += [f"| `{r.path}` | {cell(r.type)} | {cell(r.default)} | {cell(r.allowed)} | {cell(r.description)} |"
            for r in rows]
    return out + [""]


def variant_label(section: str, variant: Schema) -> str:
    """How a user picks a variant of a union section: its `name`, else the key only it requires."""
    name = variant.get("properties", {}).get("name", {})
    values = [name["const"]] if "const" in name else name.get("enum", [])
    if len(values) == 1:
        return f"`{section}.name: {values[0]}`"
    first = next(iter(variant.get("required", [])), "")
    return f"`{section}.{first}`"


def section_default_title(section: str) -> str | None:
    """The class name of a section's default (the gpt of `model`), to mark that variant as the default."""
    value = JobSpec.model_fields[section].get_default(call_default_factory=True)
    return type(value).__name__ if value is not None else None


def shared_keys(variants: list[Schema]) -> list[str]:
    """The keys every variant of a union section takes alike (the model's blocks, the data's loader)."""
    first = variants[0].get("properties", {})
    return [k for k, v in first.items() if all(other.get("properties", {}).get(k) == v for other in variants[1:])]


def sentence(text: str) -> str:
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else ""


def reference_markdown() -> str:
    walker = Walker(JobSpec.model_json_schema())
    top = walker.root
    lines = [INTRO]
    scalars = [r for r in walker.rows({"properties": {k: v for k, v in top["properties"].items()
                                                      if not walker.mappings(v)[1]},
                                       "required": top.get("required", [])}, "")]
    sections = [k for k, v in top["properties"].items() if walker.mappings(v)[1]]
    lines += ["Sections: " + ", ".join(f"[{s}](#{s})" for s in sections) + ".", ""]
    lines += ["## Top level", "", *table(scalars)]
    for section in sections:
        prop = top["properties"][section]
        suffix, variants = walker.mappings(prop)
        lines += [f"## {section}", "", sentence(prop.get("description", ""))]
        if suffix == "[]":
            lines[-1] += f" A list (default `[]`); each entry is a mapping with the keys `{section}[].*` below."
        elif "default" in prop:
            lines[-1] += f" Absent (`{json.dumps(prop['default'])}`) unless given."
        lines.append("")
        if len(variants) == 1:
            lines += table(list(walker.rows(variants[0], section + suffix)))
            continue
        default = section_default_title(section)
        labels = [variant_label(section, v) for v in variants]
        lines += [f"One of {len(variants)} kinds, chosen by " + ", ".join(labels) + ".", ""]
        shared = shared_keys(variants)
        if shared:
            common = {"properties": {k: variants[0]["properties"][k] for k in shared}}
            lines += [f"Every kind of {section} takes:", "", *table(list(walker.rows(common, section)))]
        for variant, label in zip(variants, labels):
            mark = " (the default)" if variant.get("title") == default else ""
            own = {**variant, "properties": {k: v for k, v in variant["properties"].items() if k not in shared}}
            lines += [f"### {section}: {label}{mark}", "", variant.get("description", ""), ""]
            lines += table(list(walker.rows(own, section)))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.spec.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/spec.md is stale; write nothing")
    parser.add_argument("--out", type=Path, default=PAGE, help="where to write the page (default docs/spec.md)")
    args = parser.parse_args(argv)
    page = reference_markdown()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != page:
            print(f"{args.out} is stale: regenerate it with `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(page)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

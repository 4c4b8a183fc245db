"""The job spec reference: every schema property carries a description, and docs/spec.md is what
the generator writes from the schema now."""

from __future__ import annotations

from workers.spec import JobSpec
from workers.spec.reference import COMMAND, PAGE, main, reference_markdown


def undescribed(schema: dict) -> list[str]:
    """Every property, of JobSpec and of each section it refers to, that has no description."""
    mappings = {"JobSpec": schema, **schema.get("$defs", {})}
    return [f"{name}.{key}" for name, mapping in mappings.items()
            for key, prop in mapping.get("properties", {}).items() if not prop.get("description")]


def test_every_schema_property_has_a_description():
    missing = undescribed(JobSpec.model_json_schema())
    assert not missing, f"schema properties without a description (Field(description=...)): {missing}"


def test_the_check_names_a_property_without_a_description():
    schema = {"properties": {"steps": {"type": "integer"}}, "$defs": {"X": {"properties": {"a": {"description": "a"}}}}}
    assert undescribed(schema) == ["JobSpec.steps"]


def test_spec_page_is_current():
    current = PAGE.read_text() if PAGE.exists() else ""
    assert current == reference_markdown(), f"docs/spec.md is stale: regenerate it with `{COMMAND}`"


def test_page_lists_every_key_with_its_default_and_bounds():
    page = reference_markdown()
    assert "| `train.steps` | int | `100` | >= 1, <= 10000000 |" in page
    assert "| `parallel.pipeline.schedule` | string | `\"1f1b\"` |" in page
    assert "| `fault_injection[].kind` | string | *required* |" in page
    assert "### model: `model.hf`" in page and "| `model.hf.pretrained` |" in page


def test_check_mode_fails_on_a_stale_page_and_names_the_command(tmp_path, capsys):
    stale = tmp_path / "spec.md"
    stale.write_text("# an old page\n")
    assert main(["--check", "--out", str(stale)]) == 1
    assert COMMAND in capsys.readouterr().err
    assert main(["--out", str(stale)]) == 0 and main(["--check", "--out", str(stale)]) == 0

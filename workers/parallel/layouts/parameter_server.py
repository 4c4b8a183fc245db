"""The parameter server (`parallel.parameter_server`, model 'dlrm'): embedding tables on shard actors, the dense
part under plain DDP (workers/parallel/parameter_server/). Its name is what a job's `layout.strategy` reports.

Its rules are the spec's own (workers/spec/parameter_server.py: checked with the other sections, they refuse
every other layout beside it), so it adds none here. Its cost is DDP's: every trainer holds the model, tables
included (the checkpoint's copy), and all-reduces the dense gradients; the rows it pulls and pushes are
not predicted (the planner never proposes this layout: `parallel: auto` drops the section)."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.layouts import ddp
from workers.parallel.layouts.layout import Layout
from workers.spec import JobSpec, Violation


def no_rules(spec: JobSpec) -> Iterator[Violation]:
    return iter(())


LAYOUT = Layout("parameter_server", lambda spec: spec.parallel.parameter_server is not None, no_rules, ddp.cost)

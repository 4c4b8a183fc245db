"""Per-stage pipeline gauges, built from a job's summary."""

from types import SimpleNamespace

from service.metrics import pipeline_families


def test_pipeline_gauges_per_stage_and_none_for_other_jobs():
    stage = {"bubble_fraction": 0.21, "bubble_fraction_theoretical": 0.2, "activation_bytes_peak": 1024}
    rows = [SimpleNamespace(id="j1", name="pp", summary={"pipeline": {"stages": [{"stage": 0, **stage},
                                                                                 {"stage": 1, **stage}]}}),
            SimpleNamespace(id="j2", name="ddp", summary={"pipeline": None}),
            SimpleNamespace(id="j3", name="running", summary=None)]
    families = {f.name: f for f in pipeline_families(rows)}
    assert set(families) == {"trainyard_pipeline_bubble_fraction", "trainyard_pipeline_bubble_fraction_theoretical",
                             "trainyard_pipeline_activation_bytes_peak"}
    samples = families["trainyard_pipeline_bubble_fraction"].samples
    assert [(s.labels, s.value) for s in samples] == [({"job": "j1", "name": "pp", "stage": "0"}, 0.21),
                                                       ({"job": "j1", "name": "pp", "stage": "1"}, 0.21)]

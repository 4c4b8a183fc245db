"""bench/rank_threads.py's report: per-sample CPU over the bench's steady window, not the process's life."""

from __future__ import annotations

import json

from bench.rank_threads import bench_windows, report


def test_the_report_gives_the_training_threads_cpu_per_sample_over_the_steady_window(tmp_path, capsys):
    # thread counters: [name, minflt, cpu_s, voluntary, involuntary, run-queue wait_s]; the training
    # thread burns 1 CPU-s per wall second only inside the window (t=10..20), a helper thread 0.1.
    def counters(t: float) -> dict:
        busy = min(max(t - 10.0, 0.0), 10.0)
        return {"1": ["python", int(100 * busy), busy, 0, int(50 * busy), 0.0],
                "2": ["gloo_tcp_loop", 0, 0.1 * t, int(100 * t), 0, 0.0]}
    samples = [[float(t), counters(float(t))] for t in range(0, 31)]
    threads = tmp_path / "threads.json"
    threads.write_text(json.dumps({"42": {"kind": "torchrun", "samples": samples}}))
    bench = tmp_path / "hf.json"
    bench.write_text(json.dumps({"pairs": {"fsdp": [{"torchrun_sps": 20.0, "trainyard_sps": 19.0,
                                                     "steady_windows": {"torchrun": [10.0, 20.0]}}]}}))
    report(threads, bench_windows(bench))
    line = capsys.readouterr().out
    # 10 CPU-s of training thread over 20 samples/s x 10 s = 200 samples: 50 ms each; the process adds 1 CPU-s
    assert "window 10.0s (steady)" in line
    assert "CPU 50.0 ms/sample" in line
    assert "(1.100 s/s, 55.0 ms/sample)" in line
    assert "minor faults/sample 5" in line

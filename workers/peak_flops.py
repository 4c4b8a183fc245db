"""The peak FLOP/s of one worker, for MFU: looked up from the device's name, or set by hand.

Dense figures (no structured sparsity: half of the headline "with sparsity" numbers), per GPU, from
the vendors' data sheets; bf16 for 16-bit autocast jobs, fp32 (plain FP32, not TF32) otherwise.
`TRAINYARD_PEAK_FLOPS_PER_WORKER` > 0 overrides the table (another SKU, clocks, or another dtype).
A CPU worker has no such figure: its peak is unknown, and the reason says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

OVERRIDE_ENV = "TRAINYARD_PEAK_FLOPS_PER_WORKER"
T = 1e12

# Name fragment (as torch.cuda.get_device_name reports it, upper-cased) -> (bf16, fp32) dense FLOP/s.
# Longer fragments first: "H100 PCIE" before "H100".
PEAK_FLOPS: dict[str, tuple[float, float]] = {
    "H100 PCIE": (756 * T, 51.2 * T),
    "H100 NVL": (835 * T, 60 * T),
    "H100": (989.4 * T, 66.9 * T),  # SXM5
    "H200 NVL": (835 * T, 60 * T),
    "H200": (989.4 * T, 66.9 * T),  # SXM
    "A100": (312 * T, 19.5 * T),  # SXM4 and PCIe, 40 and 80 GB
    "L40S": (362.05 * T, 91.6 * T),
    "A10G": (70 * T, 31.2 * T),  # AWS part, no NVIDIA sheet: the widely quoted figures (A10: 125), uncertain
    "B200": (2250 * T, 75 * T),  # HGX B200 per GPU (third-party copies quote FP32 as 75 or 80)
}


@dataclass(frozen=True)
class PeakFlops:
    flops_per_s: float | None  # None: unknown, and `reason` says why
    source: str  # "override", "table: H100", or "unknown"
    reason: str = ""


def lookup(device_name: str | None, half: bool) -> PeakFlops:
    """The table's figure for a device name (None: a CPU), before any override."""
    if device_name is None:
        return PeakFlops(None, "unknown", f"no peak FLOP/s is known for a CPU worker: set {OVERRIDE_ENV} "
                                          f"to export MFU")
    upper = device_name.upper()
    for fragment in sorted(PEAK_FLOPS, key=len, reverse=True):
        if fragment in upper:
            bf16, fp32 = PEAK_FLOPS[fragment]
            return PeakFlops(bf16 if half else fp32, f"table: {fragment}")
    return PeakFlops(None, "unknown", f"device {device_name!r} is not in the peak FLOP/s table "
                                      f"(workers/peak_flops.py): set {OVERRIDE_ENV}")


def peak_flops(device: torch.device, half: bool, environ: dict[str, str] | None = None) -> PeakFlops:
    """This worker's peak: the override if set, else the table's figure for its device."""
    raw = (os.environ if environ is None else environ).get(OVERRIDE_ENV, "")
    try:
        override = float(raw) if raw else 0.0
    except ValueError:
        override = 0.0
    if override > 0:
        return PeakFlops(override, "override")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return lookup(name, half)

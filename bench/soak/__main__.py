"""`python -m bench.soak --minutes 30 --seed 1 [--json OUT]`: exit 1 unless every target is met."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from bench.soak.run import SoakConfig, soak


def main() -> int:
    parser = argparse.ArgumentParser(description="Trainyard fault soak (docs/ha.md)")
    parser.add_argument("--minutes", type=float, default=30.0, help="stream + chaos + drain, after start-up")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write every record here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory and its logs")
    args = parser.parse_args()
    # SIGTERM (a timeout, a Ctrl-C'd make) unwinds like an exception: every service started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ledger = soak(SoakConfig(minutes=args.minutes, seed=args.seed, json_out=args.json, keep=args.keep))
    problems = ledger.problems()
    for problem in problems:
        print("MISSED:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

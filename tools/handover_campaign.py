#!/usr/bin/env python3
"""The handover campaign: swarm runs (``consensus.sim.search.swarm_config``) as SDPaxos
with 1-6 planned sequencer handovers in the fault phase, each judged (consistent and
agreement over every incarnation, nothing lost, duplicated or wrong, live after the
heal, linearizable). The driver is ``tests/consensus/test_review9_handover.py``.

    python3 tools/handover_campaign.py --start 500000 --count 3000
    python3 tools/handover_campaign.py --start 302704 --count 1 --json

Exit status 0 when no run failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.consensus.test_review9_handover import handover_config, judge_handover  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--start", type=int, default=500000, help="first seed (500000)")
    ap.add_argument("--count", type=int, default=1000, help="runs (1000)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    if args.count < 1 or args.start < 0:
        print("handover_campaign: --count must be >= 1 and --start >= 0", file=sys.stderr)
        return 2
    fails: list = []
    t0 = time.monotonic()
    for k, seed in enumerate(range(args.start, args.start + args.count)):
        try:
            failures = judge_handover(handover_config(seed))
        except Exception as e:  # a SafetyViolation raised by the core is a failure too
            failures = [f"{type(e).__name__}: {e}"]
        if failures:
            fails.append({"seed": seed, "failures": failures})
            print(f"seed {seed}: {', '.join(failures)}", file=sys.stderr)
        if not args.json and (k + 1) % 250 == 0:
            print(f"{k + 1} runs, {len(fails)} failures, {time.monotonic() - t0:.0f} s", file=sys.stderr)
    result = {"start": args.start, "runs": args.count, "failures": fails, "seconds": round(time.monotonic() - t0, 1)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.count} runs from seed {args.start}: {len(fails)} failures, {result['seconds']} s")
    return 1 if fails else 0


if __name__ == "__main__":
    from store.machines import install_in_simulator  # consensus.sim.registry

    install_in_simulator()
    sys.exit(main())

"""Round-trip-time matrices for the simulator.

``GEO_RTT_MS`` is Table 1 of the SDPaxos paper (five EC2 regions), the same numbers
as ``../shared/geo/rtt-sdpaxos-table1.json``; ``load_rtt_file`` reads that file (or
any file of the same shape) instead. One-way delay is RTT / 2.
"""

from __future__ import annotations

import json
from pathlib import Path

GEO_SITES = ("CA", "OR", "OH", "IRE", "SEL")
GEO_RTT_MS: dict[str, dict[str, float]] = {
    "CA": {"CA": 1.16, "OR": 20, "OH": 52, "IRE": 139, "SEL": 146},
    "OR": {"CA": 20, "OR": 0.02, "OH": 68, "IRE": 125, "SEL": 133},
    "OH": {"CA": 52, "OR": 68, "OH": 1.1, "IRE": 84, "SEL": 197},
    "IRE": {"CA": 139, "OR": 125, "OH": 84, "IRE": 0.48, "SEL": 229},
    "SEL": {"CA": 146, "OR": 133, "OH": 197, "IRE": 229, "SEL": 1.11},
}
LAN_RTT_MS = 0.2
LAN_LOCAL_RTT_MS = 0.05


def load_rtt_file(path: str | Path) -> tuple[tuple[str, ...], dict[str, dict[str, float]]]:
    """Read ``{"regions": [...], "rtt_ms": {a: {b: ms}}}``; the matrix may be one-sided."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not a JSON RTT table ({exc})") from None
    try:
        regions = tuple(doc["regions"])
        raw = doc["rtt_ms"]
        rtt = {a: {} for a in regions}
        for a in regions:
            for b in regions:
                value = raw.get(a, {}).get(b, raw.get(b, {}).get(a))
                if value is None:
                    raise KeyError(f"{a}-{b}")
                rtt[a][b] = float(value)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not an RTT table (missing {exc})") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not an RTT table ({exc})") from None
    return regions, rtt


def sites_for(replicas: int, rtt: str, rtt_file: str | None = None) -> tuple[list[str], list[list[float]]]:
    """Site names and the RTT matrix (ms) for ``replicas`` replicas, one per site.

    Geo with 3 replicas uses CA, OR, OH; with 5 all five regions. With 7, two more
    replicas sit beside CA and OR (same region, local RTT), since the paper's table
    has five regions. LAN puts every pair at ``LAN_RTT_MS``.
    """
    if rtt == "lan":
        names = [f"R{i}" for i in range(replicas)]
        matrix = [[LAN_LOCAL_RTT_MS if i == j else LAN_RTT_MS for j in range(replicas)] for i in range(replicas)]
        return names, matrix
    if rtt != "geo":
        raise ValueError(f"unknown RTT model {rtt!r} (geo or lan)")
    regions, table = load_rtt_file(rtt_file) if rtt_file else (GEO_SITES, GEO_RTT_MS)
    if replicas <= len(regions):
        placed = list(regions[:replicas])
        names = placed
    else:
        extra = replicas - len(regions)
        placed = list(regions) + [regions[k % len(regions)] for k in range(extra)]
        names = list(regions) + [f"{regions[k % len(regions)]}-2" for k in range(extra)]
    matrix = [[table[a][b] for b in placed] for a in placed]
    return names, matrix


def peer_order(matrix: list[list[float]]) -> tuple[tuple[int, ...], ...]:
    """Each replica's peers, nearest first (ties broken by id)."""
    n = len(matrix)
    return tuple(tuple(sorted((p for p in range(n) if p != r), key=lambda p: (matrix[r][p], p))) for r in range(n))

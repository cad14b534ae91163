"""Linearizability checking: the WGL search (``linear``), the partition scheduler with time and
memory budgets (``core``), and a brute-force reference for tests (``bruteforce``).

Public interface: ``check(history, model, timeout_s=..., memory_bytes_max=..., workers=...)``
returning a ``CheckResult`` (``valid`` is True, False or ``"unknown"``; ``linearizable`` is
True/False/None; ``violation`` explains a refutation), and ``merge_valid``.
"""

from .core import UNKNOWN_VERDICT, CheckResult, PartitionResult, Violation, check, merge_valid

__all__ = ["UNKNOWN_VERDICT", "CheckResult", "PartitionResult", "Violation", "check", "merge_valid"]

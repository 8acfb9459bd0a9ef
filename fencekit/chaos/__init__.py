"""Chaos testing: workers contending for leases under a nemesis, and a history checker.

``fencekit chaos`` runs it; :func:`run_chaos` is the same from Python. See docs/chaos.md.
"""

from fencekit.chaos.checker import LogRow, Report, Violation, check, format_report
from fencekit.chaos.run import SCOPES, ChaosConfig, ChaosResult, run_chaos

__all__ = [
    "SCOPES",
    "ChaosConfig",
    "ChaosResult",
    "LogRow",
    "Report",
    "Violation",
    "check",
    "format_report",
    "run_chaos",
]

"""Chaos testing: workers contending for leases under a nemesis, and a history checker.

``fencekit chaos`` runs it; :func:`run_chaos` is the same from Python. See docs/chaos.md.
"""

from fencekit.chaos.run import ChaosConfig, ChaosResult, run_chaos

__all__ = ["ChaosConfig", "ChaosResult", "run_chaos"]

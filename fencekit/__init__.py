"""fencekit: make PostgreSQL reject stale writes with fencing tokens."""

__version__ = "0.1.0"

"""``fencekit chaos --ha``, bounded: workers contend for leases of the built-in issuer while the
primary of a Patroni cluster is killed, once with asynchronous and once with synchronous
replication; the chaos checker must pass both, and the report must show the failover and what
it lost. The longer run is a documented command (docs/ha.md).
"""

from __future__ import annotations

import pytest

from fencekit.chaos.ha import HAConfig, format_ha, run_ha
from fencekit.cli import main
from fencekit.ha.cluster import PatroniCluster


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_chaos_ha_passes_and_reports_the_loss(cluster: PatroniCluster, mode: str) -> None:
    res = run_ha(HAConfig(mode=mode, duration=5, kill_at=0.5, lag=1.0, seed=7), cluster=cluster)
    text = format_ha(res)
    assert res.report.violations == [], text
    assert res.ok, text
    assert res.timelines[1] == res.timelines[0] + 1
    assert res.writes_after > 0
    assert res.report.grants > 0
    assert "killed" in " ".join(res.events)
    if mode == "async":
        # The standby was cut off for a second before the kill: what it never received is
        # lost, and the report says how much and how recent.
        assert res.lost_writes, text
        assert 0 < res.lost_window_ms < 5000
        assert "lost in the failover" in text
    else:
        assert res.lost_writes == [], text
        assert res.lost_grants == [], text


def test_chaos_ha_command_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI entry (`fencekit chaos --ha`) checks its input before starting any server; the
    full command is the documented long run (docs/ha.md), too slow for the suite."""
    assert main(["chaos", "--ha", "sometimes"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["chaos", "--ha", "async", "--duration", "1"]) == 2
    assert "duration must exceed 2 s" in capsys.readouterr().out
    assert main(["chaos", "--help"]) == 0
    assert "--ha" in capsys.readouterr().out

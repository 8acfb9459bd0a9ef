"""``python -m tests.lab ha``, bounded: workers contend for leases of the built-in issuer while the
primary of a Patroni cluster is killed, once with asynchronous and once with synchronous
replication; the chaos checker must pass both, and the report must show the failover and what
it lost. The longer run is a documented command (docs/ha.md).
"""

from __future__ import annotations

import pytest

from fencekit.cli import main
from tests.lab.__main__ import main as lab_main
from tests.lab.chaos_ha import HAConfig, format_ha, run_ha
from tests.lab.patroni import PatroniCluster

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)


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
    """The lab's command (`python -m tests.lab ha`) checks its input before starting any
    server; the full command is the documented long run (docs/ha.md), too slow for the suite."""
    with pytest.raises(SystemExit) as exc:
        lab_main(["ha", "sometimes"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    assert lab_main(["ha", "async", "--duration", "1"]) == 2
    assert "duration must exceed 2 s" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        lab_main(["ha", "--help"])
    assert exc.value.code == 0
    assert "Patroni" in capsys.readouterr().out


def test_the_product_cli_has_no_lab_command() -> None:
    """`fencekit chaos` runs against the user's database or the embedded server; the Patroni
    run needs the lab (a checkout), so the installed command does not offer it."""
    assert main(["chaos", "--ha"]) == 2

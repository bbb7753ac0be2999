"""A partition leader killed mid-stream on a real youzan HA cluster loses nothing acknowledged.

Runs bench/ha_failover.py's scenario on a real cluster of its own (it kills and restarts
a node, so not on the shared one of ``dev.py test --real-ha``): a Producer publishes with
acknowledgements while a plain and an ordered Consumer read; the leader of partition 0
is killed (SIGKILL) and comes back 30 s later. Needs youzan's binaries:
``FASTNSQ_REAL_HA_BIN`` (``dev.py test --real-ha`` sets it) and etcd on PATH.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from fastnsq.testing.real import ENV_REAL_HA_BIN, ENV_REAL_HA_NEXT_PORT, RealHACluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
ha_failover = pytest.importorskip("ha_failover")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def real_ha_cluster():
    bin_dir = os.environ.get(ENV_REAL_HA_BIN, "").strip()
    if not bin_dir:
        pytest.skip(f"needs youzan's HA nsqd and nsqlookupd: set {ENV_REAL_HA_BIN} (dev.py test --real-ha BIN_DIR)")
    if shutil.which("etcd") is None:
        pytest.skip("needs etcd on PATH (apt-get install etcd-server)")
    # Its own ports: after the run's shared cluster when that one has a base port, else the kernel's.
    base_port = int(os.environ.get(ENV_REAL_HA_NEXT_PORT, "0") or 0)
    with RealHACluster(Path(bin_dir), standalone=False, base_port=base_port) as cluster:
        yield cluster


async def test_killing_a_partition_leader_loses_nothing_acknowledged(real_ha_cluster):
    result = await ha_failover.failover(
        real_ha_cluster, messages=3000, rate=100.0, kill_after=5.0, restart_after=30.0, drain_timeout=120.0
    )
    print(f"\nleader kill: {result}")
    timeline = [what for _, what in result["timeline"]]
    assert any(what.startswith("lookupd names 127.0.0.1") for what in timeline), timeline  # a leader again
    assert result["acknowledged"] >= 0.9 * result["published"]  # the other partition took the load
    for name, channel in result["channels"].items():
        assert channel["lost"] == 0, f"{name}: acknowledged but never delivered: {channel['lost_sample']}"

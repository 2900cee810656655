"""The suite's worker groups hold: a module marked with an xdist_group runs on one worker, so a
session fixture it shares with other modules is computed once, not once per worker."""

import pytest

pytestmark = pytest.mark.xdist_group("worker_groups")


def test_a_grouped_test_carries_its_group_to_the_scheduler(request):
    if not hasattr(request.config, "workerinput") or not request.config.getvalue("loadgroup"):
        pytest.skip("not running on pytest-xdist workers with --dist loadgroup (e.g. -n 0)")
    # LoadGroupScheduling sends tests whose node ids share an "@group" suffix to one worker; a
    # pytest that ignores xdist's suffix scatters them (and doubles every shared fixture).
    assert request.node.nodeid.endswith("@worker_groups"), request.node.nodeid

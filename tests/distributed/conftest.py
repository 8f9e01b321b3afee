import pytest

from tests.distributed.cluster import LoopbackCluster, can_make_namespaces


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and two simulated nodes of 2 CPUs each, on loopback in their own network namespace."""
    if (why := can_make_namespaces()) is not None:
        pytest.skip(f"Ray loopback cluster: {why}")
    made = LoopbackCluster(tmp_path_factory.mktemp("ray"), n_nodes=2, cpus=2)
    yield made
    left = made.stop()
    assert not left, f"processes left in the cluster's namespace after its nodes stopped: {left}"

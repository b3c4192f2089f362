import os

from tools.memory import summarize


def test_slope_separates_a_leak_from_noise():
    leak = [{"epoch": e, "host_rss_mib": 1000 + 5 * e} for e in range(20)]
    noise = [{"epoch": e, "host_rss_mib": 1000 + (50 if e % 7 < 3 else 0)} for e in range(20)]
    assert summarize(leak)["host_rss_mib"]["slope_per_epoch"] == 5.0
    assert abs(summarize(noise)["host_rss_mib"]["slope_per_epoch"]) < 1.0
    assert summarize(noise)["host_rss_mib"]["max"] == 1050


def test_stream_memory_slope_and_its_tree():
    from tools.stream_memory import slope, tree_rss_mib

    assert slope([0.0, 0.5, 1.0, 1.5], [100.0, 110.0, 120.0, 130.0]) == 20.0  # MiB per GB
    assert slope([0.3], [100.0]) == 0.0 and slope([1.0, 1.0], [1.0, 2.0]) == 0.0
    assert tree_rss_mib(set()) > tree_rss_mib({os.getpid()}) >= 0

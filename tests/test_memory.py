from tools.memory import summarize


def test_slope_separates_a_leak_from_noise():
    leak = [{"epoch": e, "host_rss_mib": 1000 + 5 * e} for e in range(20)]
    noise = [{"epoch": e, "host_rss_mib": 1000 + (50 if e % 7 < 3 else 0)} for e in range(20)]
    assert summarize(leak)["host_rss_mib"]["slope_per_epoch"] == 5.0
    assert abs(summarize(noise)["host_rss_mib"]["slope_per_epoch"]) < 1.0
    assert summarize(noise)["host_rss_mib"]["max"] == 1050

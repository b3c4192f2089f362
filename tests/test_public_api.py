"""The package root's public API: small and sorted (issue 42; torchdata's ``nodes`` does the
same). Everything else is imported from its module."""
import pipelines

BUDGET = 25


def test_the_public_api_is_at_most_25_names_and_sorted():
    names = pipelines.__all__
    assert len(names) <= BUDGET, f"pipelines.__all__ has {len(names)} names, budget {BUDGET}"
    assert sorted(names) == names, "keep pipelines.__all__ sorted"
    assert len(set(names)) == len(names)


def test_every_public_name_resolves_and_star_import_gives_exactly_them():
    for name in pipelines.__all__:
        assert getattr(pipelines, name) is not None, name
    ns: dict = {}
    exec("from pipelines import *", ns)
    assert sorted(k for k in ns if k != "__builtins__") == pipelines.__all__


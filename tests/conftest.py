import os

from hypothesis import HealthCheck, settings

# Property tests: deterministic in CI (same examples every run), no per-example deadline
# (the machines are shared and slow), a modest number of examples so `make test` stays quick.
settings.register_profile(
    "fusionlab", max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fusionlab"))


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _environment_unchanged(request):
    """No test leaves `os.environ` changed (monkeypatch's changes are undone before this runs).

    `make test` runs the unit tests and then nbval in one process, and nbval's notebook kernels inherit its
    environment: onnxruntime-extensions once set PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python on import, so every
    notebook after the custom-op tests ran protobuf in pure Python and 05's sweep cell ran past its timeout.
    """
    before = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    yield
    after = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    if after != before:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for k in changed:
            if k in before:
                os.environ[k] = before[k]
            else:
                os.environ.pop(k, None)
        pytest.fail(f"{request.node.nodeid} left os.environ changed: {', '.join(changed)} (a child process, such "
                    "as nbval's notebook kernels, would inherit it)", pytrace=False)


def pytest_collection_modifyitems(config, items):
    """A rule's test on the real exports of tests/corpus/ is named test_corpus_* (in whichever file holds the rule's
    tests): marked slow here, by its name, so it stays slow when its tests move between files."""
    for item in items:
        if getattr(item, "originalname", item.name).startswith("test_corpus_"):
            item.add_marker(pytest.mark.slow)


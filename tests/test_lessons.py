"""fusionlab.lessons: the lesson modules live apart from the engine, and their old names still import."""

import importlib

import pytest

import fusionlab


@pytest.mark.parametrize("old, new", sorted(fusionlab._MOVED.items()))
def test_old_names_still_import(old, new):
    module = importlib.import_module(f"fusionlab.lessons.{new}")
    with pytest.warns(DeprecationWarning, match=f"fusionlab.{old} moved to fusionlab.lessons.{new}"):
        assert getattr(fusionlab, old) is module


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        fusionlab.nonexistent  # noqa: B018

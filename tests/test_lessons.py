"""fusionlab.lessons: the lesson modules live apart from the engine; the package has no moved-name shims."""

import pytest

import fusionlab


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        fusionlab.nonexistent  # noqa: B018

"""`ByIdentity`: values made once per object, found by identity, never another object's."""

import pytest

from fd_guided.unique.by_identity import ByIdentity

pytestmark = pytest.mark.cpu


def test_a_value_is_made_once_per_object_and_tag_and_never_served_to_an_equal_object():
    made = []
    cache = ByIdentity(max_entries=8)
    first, equal = (b"a", b"b"), tuple([b"a", b"b"])
    assert first == equal and first is not equal

    def make(texts, tag=None):
        made.append((texts, tag))
        return [texts, tag]

    value = cache.get(first, make, first)
    assert cache.get(first, make, first) is value and len(made) == 1
    assert cache.get(equal, make, equal) is not value and len(made) == 2  # by identity, not equality
    tagged = cache.get(first, make, first, b"a", tag=b"a")
    assert tagged == [first, b"a"] and cache.get(first, make, first, b"a", tag=b"a") is tagged
    assert len(made) == 3


def test_past_its_bound_it_is_cleared_and_values_are_made_again():
    cache = ByIdentity(max_entries=4)
    held = [tuple([i]) for i in range(5)]
    values = [cache.get(texts, list, texts) for texts in held]  # the fifth clears the first four
    assert cache.get(held[4], list, held[4]) is values[4]
    assert cache.get(held[0], list, held[0]) is not values[0]
    cache.clear()
    assert cache.get(held[4], list, held[4]) is not values[4]

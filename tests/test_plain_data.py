"""Only plain data crosses from a generated solution to its tests: pack/unpack keep every built-in
value exactly, convert library values to the built-ins they stand for, refuse the solution's own
types, and unpack refuses anything pack would not write."""
import json
import math
from collections import Counter, OrderedDict, defaultdict, namedtuple
from fractions import Fraction

import pytest

from byzantium.tasks.plain_data import pack, unpack


def _cross(value):
    return unpack(json.loads(json.dumps(pack(value))))


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2 ** 20000, 0.1, -0.0, 1e308, math.inf, -math.inf, 3 + 4j, "", "héllo\n\ud800",
    b"\x00\xff", [1, [2, (3, "x")]], (), (1,), {1, 2}, frozenset({"a"}), {"k": [1.5], (1, 2): None, 3: {4: 5}},
], ids=lambda v: type(v).__name__)
def test_built_in_values_cross_exactly(value):
    back = _cross(value)
    assert back == value and type(back) is type(value)
    if isinstance(value, float):
        assert math.copysign(1, back) == math.copysign(1, value)


def test_nan_crosses():
    assert math.isnan(_cross(math.nan))


def test_library_values_become_the_built_ins_they_stand_for():
    assert type(_cross(Counter("aab"))) is dict and _cross(Counter("aab")) == {"a": 2, "b": 1}
    assert type(_cross(OrderedDict(a=1))) is dict and type(_cross(defaultdict(list))) is dict
    assert _cross(Fraction(1, 2)) == 0.5
    np = pytest.importorskip("numpy")
    assert _cross(np.int64(3)) == 3 and type(_cross(np.int64(3))) is int
    assert _cross(np.array([[1, 2]])) == [[1, 2]] and _cross(np.bool_(True)) is True


def test_the_solutions_own_types_are_refused():
    namespace = {"__name__": "__main__"}
    exec("class Any:\n    def __eq__(self, other):\n        return True\n"
         "class Sneaky(int):\n    def __eq__(self, other):\n        return True\n", namespace)
    for value in (namespace["Any"](), [namespace["Sneaky"](1)], {"k": namespace["Any"]()}):
        with pytest.raises(TypeError, match="defined itself"):
            pack(value)
    with pytest.raises(TypeError, match="cannot be compared"):
        pack(object())


def test_a_library_tuple_subclass_becomes_a_tuple():
    Point = namedtuple("Point", "x y", module="geometry")
    assert type(_cross(Point(1, 2))) is tuple and _cross(Point(1, 2)) == (1, 2)


@pytest.mark.parametrize("tree", [
    [], ["int"], ["int", 5], ["bool", 1], ["str", 3], ["float", "1.0", "2"], ["list", "abc"],
    ["dict", [[["int", "0x1"]]]], ["set", [["list", []]]], ["eval", "__import__('os')"], "none", None,
])
def test_unpack_refuses_what_pack_would_not_write(tree):
    with pytest.raises((ValueError, TypeError)):
        unpack(tree)

"""Values as plain data, to cross the pipe between a generated solution and the tests that check it.

    pack(value) -> a JSON-able tree        unpack(tree) -> the value, of Python's built-in types only

The solution's process packs what its function returns; the tests' process unpacks it. Whatever
the solution sends, the tests see None, bool, int, float, complex, str, bytes, list, tuple, set,
frozenset or dict built here, never an object of the solution's (an `__eq__` that is always true
cannot cross). A value of a type the solution defined itself is refused with a clear error; one of a
library's type is converted to the built-in it stands for (a numpy array or scalar through
`tolist()`, an integral or real number through int() or float(), a Counter or OrderedDict as a dict),
as the value the official harness would have compared.

This file is also sent, as source, into both sandboxed processes: it imports nothing of the package.
"""
import numbers

_SEQUENCES = (list, tuple, set, frozenset)


def pack(value):
    t = type(value)
    if value is None:
        return ["none"]
    if t is bool:
        return ["bool", value]
    if t is int:
        return ["int", hex(value)]  # hex: no limit on the digits of a long int's str()
    if t is float:
        return ["float", value.hex()]  # exact, and inf/nan too
    if t is complex:
        return ["complex", value.real.hex(), value.imag.hex()]
    if t is str:
        return ["str", value]
    if t is bytes:
        return ["bytes", value.hex()]
    if t in _SEQUENCES:
        return [t.__name__, [pack(v) for v in value]]
    if t is dict:
        return ["dict", [[pack(k), pack(v)] for k, v in value.items()]]
    return pack(_as_builtin(value, t))


def _as_builtin(value, t):
    if t.__module__ == "__main__":
        raise TypeError(f"the solution returned a value of a type it defined itself ({t.__qualname__})")
    name = f"{t.__module__}.{t.__qualname__}"
    if t.__module__.split(".")[0] == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    for base in (bool, int, float, complex, str, bytes, *_SEQUENCES, dict):
        if isinstance(value, base):
            return base(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"a value of type {name} cannot be compared outside the solution's process")


def unpack(tree):
    """The value of a packed tree; anything that is not exactly what pack() writes is refused."""
    if not isinstance(tree, list) or not tree or not isinstance(tree[0], str):
        raise ValueError("not a packed value")
    kind, args = tree[0], tree[1:]
    if kind == "none" and not args:
        return None
    if kind == "bool" and len(args) == 1 and type(args[0]) is bool:
        return args[0]
    if kind == "str" and len(args) == 1 and type(args[0]) is str:
        return args[0]
    if all(type(a) is str for a in args):
        if kind == "int" and len(args) == 1:
            return int(args[0], 16)
        if kind == "float" and len(args) == 1:
            return float.fromhex(args[0])
        if kind == "complex" and len(args) == 2:
            return complex(float.fromhex(args[0]), float.fromhex(args[1]))
        if kind == "bytes" and len(args) == 1:
            return bytes.fromhex(args[0])
    if len(args) == 1 and type(args[0]) is list:
        items = args[0]
        if kind in ("list", "tuple", "set", "frozenset"):
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](unpack(v) for v in items)
        if kind == "dict" and all(type(kv) is list and len(kv) == 2 for kv in items):
            return {unpack(k): unpack(v) for k, v in items}
    raise ValueError(f"not a packed value: {str(tree)[:80]}")

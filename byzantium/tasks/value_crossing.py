"""How a value crosses the pipe between a generated solution and the tests that check it
(humaneval.py runs them in two sandboxes).

    describe(value, memo) -> a JSON-able tree         rebuild(tree, objects) -> the value
    describe_exception(exc) / rebuild_exception(tree)
    describe_states(memo) / apply_states(states, objects)    arguments changed in place

Safe: the solution's process is the attacker's, so whatever tree it sends, rebuild() makes only
objects whose code is the interpreter's, the standard library's or numpy's, or classes it makes
itself with nothing but a built-in's behaviour. A solution's subclass of a built-in (a namedtuple,
an IntEnum, its own exception) arrives as a subclass of the same name made here; an object of a
class of its own arrives as a stand-in equal only to itself. No code of the solution's runs where
the tests run (an `__eq__` that is always true cannot cross), and a forged tree can only name a value
that an honest solution could have returned.

Faithful: a HumanEval test asks a returned value ==, tuple(), len, isinstance, abs(a - b) < tol, and
its type answers. The tree keeps the type (a generator stays a generator, a deque a deque, a Decimal
a Decimal, a numpy array an array), the items in order, and which objects are one object: an
argument the solution changed in place is changed in the tests' process too, and an argument it
returns is the test's own object.

Both processes run this file from its source: it imports nothing of the package.
"""
import builtins
import sys

_FACTORIES = {"int": int, "float": float, "str": str, "list": list, "dict": dict, "set": set, "tuple": tuple,
              "frozenset": frozenset, "bool": bool}  # the defaultdict factories that cross; others cross as None
_NUMPY_KINDS = "biufcUS"  # numbers, booleans and strings: arrays of objects do not cross
_SUBCLASSES = {}  # (base, name) -> the subclass made here


class Memo:
    """Numbers the objects described so far: each is sent once, later named by its number. It holds
    them, so no id is reused while a message is built. `objects` (number -> object) seeds it with
    the objects the other side sent."""

    def __init__(self, objects=None):
        self.objects = dict(objects or {})
        self.numbers = {id(obj): n for n, obj in self.objects.items()}
        self.next = max(self.objects, default=-1) + 1

    def number(self, value):
        """(number, seen before)."""
        n = self.numbers.get(id(value))
        if n is not None:
            return n, True
        n, self.next = self.next, self.next + 1
        self.numbers[id(value)], self.objects[n] = n, value
        return n, False


# ---------------------------------------------------------------------------------------- describe

def describe(value, memo):
    t = type(value)
    if value is None:
        return ["none"]
    if t is bool:
        return ["bool", value]
    if t is int:
        return ["int", hex(value)]  # hex: no limit on a long int's digits
    if t is float:
        return ["float", value.hex()]  # exact, inf and nan too
    if t is complex:
        return ["complex", value.real.hex(), value.imag.hex()]
    n, seen = memo.number(value)
    if seen:
        return ["ref", n]
    if t is str:
        return ["str", n, value]
    if t is bytes:
        return ["bytes", n, value.hex()]
    if t is range:
        return ["range", n, hex(value.start), hex(value.stop), hex(value.step)]
    name = _library_name(t)
    if t in (list, tuple, set, frozenset, dict, bytearray) or name in _LIBRARY:
        return [name or t.__name__, n, *_content(value, memo)]
    if name in ("dict_keys", "dict_values"):
        return [name, n, [describe(v, memo) for v in value]]
    if name == "dict_items":
        return [name, n, [[describe(k, memo), describe(v, memo)] for k, v in value]]
    if name == "numpy.ndarray" and value.dtype.kind in _NUMPY_KINDS:
        return ["ndarray", n, value.dtype.str, list(value.shape), describe(value.tolist(), memo)]
    if name.startswith("numpy.") and hasattr(value, "dtype") and value.dtype.kind in _NUMPY_KINDS and value.ndim == 0:
        return ["npscalar", n, value.dtype.str, describe(value.item(), memo)]
    if hasattr(t, "__next__") and hasattr(t, "__iter__"):  # a generator, reversed(), map(), zip(), ...
        items, error = _drain(value, memo)
        return ["iter", n, name == "generator", items, error]
    base = _trusted_base(t)
    if base is not None:  # a namedtuple, an IntEnum, a str subclass, ...: its built-in value, under its name
        return ["sub", n, t.__name__, describe(_as_base(value, base), memo)]
    items, error = _drain(iter(value), memo) if hasattr(t, "__iter__") else (None, None)
    return ["opaque", n, t.__name__, items, error]


_LIBRARY = {"decimal.Decimal", "fractions.Fraction", "collections.deque", "collections.OrderedDict",
            "collections.Counter", "collections.defaultdict"}
_BUILTIN_BASES = (int, float, complex, str, bytes, tuple, frozenset, list, dict, set, bytearray)


def _library_name(t):
    """'module.Name' for a class of the standard library or numpy (checked to be the module's own
    class, not one that claims its name); the bare name for a built-in; '' otherwise."""
    module = t.__module__
    if module == "builtins":
        return t.__name__
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, t.__qualname__, None) is t:
        if module == "numpy" or module.startswith("numpy."):
            return f"numpy.{t.__qualname__}"
        return f"{module}.{t.__qualname__}"
    return ""


def _trusted_base(t):
    for cls in t.__mro__[1:]:
        if cls in _BUILTIN_BASES or _library_name(cls) in _LIBRARY:
            return cls
    return None


def _as_base(value, base):
    """The value as its base class's own instance, read through the base's methods."""
    if base in (int, float, str):
        return {int: int.__int__, float: float.__float__, str: str.__str__}[base](value)
    if base is complex:
        return complex(float.__float__(value.real), float.__float__(value.imag))
    name = _library_name(base)
    if name == "collections.deque":
        return base(value, value.maxlen)
    if name == "collections.defaultdict":
        return base(value.default_factory, value)
    return base(value)


def _content(value, memo):
    """The payload of a container's node (also what describe_states sends of an argument)."""
    name = _library_name(type(value))
    if name == "bytearray":
        return [value.hex()]
    if name == "decimal.Decimal":
        return [str(value)]
    if name == "fractions.Fraction":
        return [hex(value.numerator), hex(value.denominator)]
    if name == "collections.deque":
        return [[describe(v, memo) for v in value], value.maxlen]
    if name in ("dict", "collections.OrderedDict", "collections.Counter", "collections.defaultdict"):
        pairs = [[describe(k, memo), describe(v, memo)] for k, v in value.items()]
        if name != "collections.defaultdict":
            return [pairs]
        factory = getattr(value.default_factory, "__name__", None)
        return [factory if _FACTORIES.get(factory) is value.default_factory else None, pairs]
    return [[describe(v, memo) for v in value]]


def _drain(iterator, memo):
    """An iterator's items as they come, and what it raised after them (None: it ended)."""
    items = []
    try:
        for v in iterator:
            items.append(describe(v, memo))
    except Exception as e:  # noqa: BLE001 - the iterator's own exception crosses with it
        return items, describe_exception(e)
    return items, None


def describe_exception(exc):
    """Its class's name, the built-in exception classes it derives from (most derived first), its args."""
    t = type(exc)
    bases = [c.__name__ for c in t.__mro__ if getattr(builtins, c.__name__, None) is c and issubclass(c, BaseException)]
    try:
        args = describe(tuple(exc.args), Memo())
    except Exception:  # noqa: BLE001 - args that do not cross: its message instead
        args = describe((str(exc)[:2000],), Memo())
    return ["exception", str(t.__name__), bases, args]


def describe_states(memo, mutable_numbers):
    """The contents now of the objects the other side sent that can change in place."""
    return [[n, _content(memo.objects[n], memo)] for n in mutable_numbers]


# ----------------------------------------------------------------------------------------- rebuild

class Opaque:
    """What the tests see of an object of a class of the solution's own: equal only to itself, and
    iterable when the object was (over the items it gave)."""

    def __init__(self, name, items):
        self.name, self.items = name, items

    def __iter__(self):
        if self.items is None:
            raise TypeError(f"'{self.name}' object is not iterable")
        return iter(self.items)

    def __repr__(self):
        return f"<{self.name} object of the solution's>"


def _bad(tree):
    return ValueError(f"not a value description: {str(tree)[:80]}")


def _text(x):
    if type(x) is not str:
        raise _bad(x)
    return x


def _hex_int(x):
    return int(_text(x), 16)


def _list(x):
    if type(x) is not list:
        raise _bad(x)
    return x


def rebuild(tree, objects):
    """The value a tree describes, built of trusted types only; `objects` (number -> object) holds
    the objects this side sent and receives the new ones."""
    tag = _text(_list(tree)[0] if tree else None)
    args = tree[1:]
    if tag == "none" and not args:
        return None
    if tag == "bool" and len(args) == 1 and type(args[0]) is bool:
        return args[0]
    if tag == "int" and len(args) == 1:
        return _hex_int(args[0])
    if tag == "float" and len(args) == 1:
        return float.fromhex(_text(args[0]))
    if tag == "complex" and len(args) == 2:
        return complex(float.fromhex(_text(args[0])), float.fromhex(_text(args[1])))
    if not args or type(args[0]) is not int or args[0] < 0:
        raise _bad(tree)
    n, args = args[0], args[1:]
    if tag == "ref" and not args:
        if n not in objects:
            raise ValueError(f"a value description refers to object {n} before it is built (a cycle through a tuple?)")
        return objects[n]
    if n in objects:
        raise ValueError(f"a value description numbers two objects {n}")
    builder = _BUILDERS.get(tag)
    if builder is None:
        raise _bad(tree)
    value = builder(n, args, objects)
    objects[n] = value
    return value


def _register(n, objects, value):
    objects[n] = value  # before its items: they may refer to it
    return value


def _items(x, objects):
    return [rebuild(v, objects) for v in _list(x)]


def _pairs(x, objects):
    pairs = []
    for kv in _list(x):
        if len(_list(kv)) != 2:
            raise _bad(kv)
        pairs.append((rebuild(kv[0], objects), rebuild(kv[1], objects)))
    return pairs


def _fill(container, pairs):
    for k, v in pairs:
        container[k] = v
    return container


def _collections():
    import collections
    return collections


def _one(args, count=1):
    if len(args) != count:
        raise _bad(args)
    return args[0] if count == 1 else args


def _build_list(n, args, objects):
    value = _register(n, objects, [])
    value.extend(_items(_one(args), objects))
    return value


def _build_dict(n, args, objects, cls=dict):
    value = _register(n, objects, cls())
    return _fill(value, _pairs(_one(args), objects))


def _build_defaultdict(n, args, objects):
    factory, pairs = _one(args, 2)
    if factory is not None and _text(factory) not in _FACTORIES:
        raise _bad(args)
    value = _register(n, objects, _collections().defaultdict(_FACTORIES.get(factory)))
    return _fill(value, _pairs(pairs, objects))


def _build_deque(n, args, objects):
    items, maxlen = _one(args, 2)
    if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
        raise _bad(args)
    value = _register(n, objects, _collections().deque(maxlen=maxlen))
    value.extend(_items(items, objects))
    return value


def _build_ndarray(n, args, objects):
    import re

    import numpy
    dtype, shape, data = _one(args, 3)
    if not re.fullmatch(r"[<>|=]?[biufcUS]\d{1,4}", _text(dtype)) or not all(type(d) is int and d >= 0 for d in _list(shape)):
        raise _bad(args)
    return numpy.array(rebuild(data, objects), dtype=numpy.dtype(dtype)).reshape(shape)


def _build_npscalar(n, args, objects):
    dtype, item = _one(args, 2)
    array = _build_ndarray(n, [dtype, [], item], objects)
    return array[()]


def _generate(items, error):
    yield from items
    if error is not None:
        raise error


def _build_iter(n, args, objects):
    is_generator, items, error = _one(args, 3)
    if type(is_generator) is not bool:
        raise _bad(args)
    items = _items(items, objects)
    error = None if error is None else rebuild_exception(error)
    return _generate(items, error) if is_generator or error is not None else iter(items)


def _build_sub(n, args, objects):
    name, base_tree = _one(args, 2)
    base = rebuild(base_tree, objects)
    cls = _subclass(type(base), _text(name))
    if type(base).__name__ == "deque":
        return cls(base, base.maxlen)
    if type(base).__name__ == "defaultdict":
        return cls(base.default_factory, base)
    return cls(base)


def _subclass(base, name):
    allowed = _BUILTIN_BASES + tuple(getattr(sys.modules.get(m), c) for m, c in
                                     (x.rsplit(".", 1) for x in _LIBRARY) if sys.modules.get(m) is not None)
    if base not in allowed and not issubclass(base, BaseException):
        raise ValueError(f"a value description subclasses {base.__name__}, which does not cross")
    name = name if name.isidentifier() and len(name) <= 100 else "Value"
    key = (base, name)
    if key not in _SUBCLASSES:
        _SUBCLASSES[key] = type(name, (base,), {"__module__": "solution"})
    return _SUBCLASSES[key]


def _build_opaque(n, args, objects):
    name, items, error = _one(args, 3)
    if items is not None:
        items = _items(items, objects)
    if error is not None:
        rebuild_exception(error)  # checked; an object that raised while iterated crosses with the items it gave
    return Opaque(_text(name)[:100], items)


def _build_library(cls_name):
    def build(n, args, objects):
        collections = _collections()
        if cls_name == "Decimal":
            import decimal
            return decimal.Decimal(_text(_one(args)))
        if cls_name == "Fraction":
            import fractions
            num, den = _one(args, 2)
            return fractions.Fraction(_hex_int(num), _hex_int(den))
        return _build_dict(n, args, objects, getattr(collections, cls_name))
    return build


_BUILDERS = {
    "str": lambda n, a, o: _text(_one(a)),
    "bytes": lambda n, a, o: bytes.fromhex(_text(_one(a))),
    "bytearray": lambda n, a, o: bytearray.fromhex(_text(_one(a))),
    "range": lambda n, a, o: range(*(_hex_int(x) for x in _one(a, 3))),
    "list": _build_list,
    "tuple": lambda n, a, o: tuple(_items(_one(a), o)),
    "set": lambda n, a, o: set(_items(_one(a), o)),
    "frozenset": lambda n, a, o: frozenset(_items(_one(a), o)),
    "dict": _build_dict,
    "dict_keys": lambda n, a, o: dict.fromkeys(_items(_one(a), o)).keys(),
    "dict_values": lambda n, a, o: dict(enumerate(_items(_one(a), o))).values(),
    "dict_items": lambda n, a, o: dict(_pairs(_one(a), o)).items(),
    "decimal.Decimal": _build_library("Decimal"),
    "fractions.Fraction": _build_library("Fraction"),
    "collections.OrderedDict": _build_library("OrderedDict"),
    "collections.Counter": _build_library("Counter"),
    "collections.defaultdict": _build_defaultdict,
    "collections.deque": _build_deque,
    "ndarray": _build_ndarray,
    "npscalar": _build_npscalar,
    "iter": _build_iter,
    "sub": _build_sub,
    "opaque": _build_opaque,
}


def rebuild_exception(tree):
    """An exception of the built-in class the solution's derived from, under its class's name."""
    if _list(tree)[:1] != ["exception"] or len(tree) != 4:
        raise _bad(tree)
    _, name, bases, args = tree
    builtin = [getattr(builtins, _text(b), None) for b in _list(bases)]
    builtin = [b for b in builtin if isinstance(b, type) and issubclass(b, BaseException)]
    base = builtin[0] if builtin else Exception
    cls = base if _text(name) == base.__name__ else _subclass(base, name)
    args = rebuild(args, {})
    if type(args) is not tuple:
        raise _bad(tree)
    try:
        return cls(*args)
    except Exception:  # noqa: BLE001 - a class that wants other arguments (UnicodeError): its args as they were
        exc = cls.__new__(cls)
        exc.args = args
        return exc


def mutable_numbers(objects):
    """The numbers of the objects that can change in place (what describe_states reports)."""
    c = _collections()
    kinds = (list, dict, set, bytearray, c.deque, c.OrderedDict, c.Counter, c.defaultdict)
    return [n for n, obj in objects.items() if type(obj) in kinds]


def apply_states(states, objects):
    """Change the objects this side sent as the solution changed them."""
    for state in _list(states):
        n, content = _one(_list(state), 2)
        if type(n) is not int or n not in objects:
            raise _bad(state)
        obj = objects[n]
        kind = type(obj)
        if kind is bytearray:
            obj[:] = bytearray.fromhex(_text(_one(content)))
        elif kind is list:
            obj[:] = _items(_one(content), objects)
        elif kind is set:
            items = _items(_one(content), objects)
            obj.clear()
            obj.update(items)
        elif kind.__name__ == "deque":
            items = _items(_one(content, 2)[0], objects)
            obj.clear()
            obj.extend(items)
        elif isinstance(obj, dict):
            pairs = _pairs(_one(content, 2)[1] if kind.__name__ == "defaultdict" else _one(content), objects)
            obj.clear()
            _fill(obj, pairs)
        else:
            raise _bad(state)

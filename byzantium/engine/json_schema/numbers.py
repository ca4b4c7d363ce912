"""Numbers within a schema's bounds (minimum, maximum, the exclusive ones, multipleOf): the shortest one,
and the fewest digits that end a number the model has begun."""
import json
import math

from .schemas import types

DIGITS = list("0123456789")


def bounds(schema):
    """(minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf), each None where not given."""
    def num(key):
        value = schema.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    low, high, xlow, xhigh, step = (num(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                                     "multipleOf"))
    if schema.get("exclusiveMinimum") is True:  # draft 4: a flag on minimum
        low, xlow = None, low
    if schema.get("exclusiveMaximum") is True:
        high, xhigh = None, high
    return low, high, xlow, xhigh, step if step and step > 0 else None


def fits(value, schema, integer):
    low, high, xlow, xhigh, step = bounds(schema)
    return ((low is None or value >= low) and (high is None or value <= high) and (xlow is None or value > xlow)
            and (xhigh is None or value < xhigh) and (step is None or abs(value / step - round(value / step)) < 1e-9)
            and (not integer or float(value).is_integer()))


def number(schema, integer):
    """The shortest number within the schema's bounds: 0 when it fits, else a bound or the integer next to one."""
    low, high, xlow, xhigh, step = bounds(schema)
    candidates = [0]
    for bound in (low, high):
        if bound is not None:
            candidates += [math.ceil(bound), math.floor(bound)] + ([] if integer else [bound])
    if xlow is not None:
        candidates.append(math.floor(xlow) + 1)
    if xhigh is not None:
        candidates.append(math.ceil(xhigh) - 1)
    if step and low is not None:
        candidates.append(math.ceil(low / step) * step)
    texts = [json.dumps(int(v) if float(v).is_integer() else v) for v in candidates if fits(v, schema, integer)]
    return min(texts, key=len, default=None)


def number_closing(written, schema):
    """The fewest digits (at most two, or a fraction of at most two) that end the number `written` within
    the schema's bounds."""
    integer = "number" not in types(schema)
    two = [a + b for a in DIGITS for b in DIGITS]
    for rest in [""] + DIGITS + two + ([] if integer else ["." + d for d in DIGITS + two]):
        try:
            value = json.loads(written + rest)
        except ValueError:
            continue
        if fits(value, schema, integer):
            return rest
    return None

"""Two helpers the resilience modules share: a seed that is the same in every process (the voting
module's), and a lenient reader for the JSON object a model was asked to reply with."""
import json

from ..plurality import stable_seed  # noqa: F401 - re-exported for the resilience modules


_DECODER = json.JSONDecoder(strict=False)  # strict=False: raw newlines inside strings, common in replies


def parse_json_object(text):
    """The first JSON object in `text` (code fences or chatter around it allowed), or None."""
    text = text or ""
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = _DECODER.raw_decode(text, start)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            return obj
        start = text.find("{", start + 1)
    return None

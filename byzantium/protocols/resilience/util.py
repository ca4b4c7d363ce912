"""Two helpers the resilience modules share: a seed that is the same in every process, and a lenient
reader for the JSON object a model was asked to reply with."""
import hashlib
import json


def stable_seed(*parts) -> int:
    """A 63-bit seed from printable parts, by sha256: never Python's hash(), which changes per process."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


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

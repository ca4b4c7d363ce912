"""A package's public names loaded on first use (PEP 562): `import byzantium` and `byzantium.server` stay
light until a name is read, so that commands needing no engine (`--help`, `plan`) start without torch."""
import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, public: dict[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's __getattr__ and __dir__; public: name -> the module (relative to package) defining it."""
    def get(name: str) -> Any:
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(public[name], package), name)
        namespace[name] = value  # looked up once
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(public))

    return get, names

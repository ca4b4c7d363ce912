"""Where Byzantium keeps files between runs (converted models, compiled kernels): one root for every layer."""
import os
from pathlib import Path


def cache_root() -> Path:
    """`$BYZANTIUM_CACHE`, else ~/.cache/byzantium."""
    env = os.environ.get("BYZANTIUM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "byzantium"

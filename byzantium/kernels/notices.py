"""Telling the user once that a slower path was taken (kept apart so every kernel module can use it)."""
import functools
import logging

logger = logging.getLogger("byzantium")


@functools.cache
def warn_once(message):
    """Log a fallback to a slower path, once per process: such fallbacks are never taken silently."""
    logger.warning(message)

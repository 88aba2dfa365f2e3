"""The stand-in's version: the installed wheel's version (importlib.metadata)."""

import os


def _detect() -> str:
    env = os.environ.get("SGLANG_STANDIN_VERSION")  # only for running from a source tree
    if env:
        return env
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # not installed: running from the source tree
        return "0.5.9"


__version__ = _detect()


def parse(v: str):
    parts = []
    for p in v.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)

"""SGLang stand-in for the inferops lab (not SGLang).

Behaves like SGLang where it matters for memory and process management; see docs/lab.md,
section "SGLang stand-in".  Its version is the version of the installed wheel.
"""


def __getattr__(name):
    if name == "__version__":
        from sglang.version import __version__

        return __version__
    raise AttributeError(name)

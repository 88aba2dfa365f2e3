"""`sglang serve ...` console script (SGLang 0.5.9+ ships one; sglang-hicache.md section 5.2)."""

import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: sglang serve [server arguments]")
        return 0 if argv else 2
    if argv[0] != "serve":
        print("sglang: error: unknown command %r (the stand-in knows 'serve')" % argv[0], file=sys.stderr)
        return 2
    from sglang.srt.entrypoints.engine import main as serve

    return serve(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

"""python3 -m sglang.launch_server ...  (the stand-in's engine; see sglang.srt.entrypoints.engine)."""

import sys

from sglang.srt.entrypoints.engine import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

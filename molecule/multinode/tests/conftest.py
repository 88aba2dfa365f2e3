# -*- coding: utf-8 -*-
"""Failed checks also go to reports/molecule-multinode-failure.txt (molecule/shared/failure_log.py)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))
import failure_log  # noqa: E402

pytest_runtest_logreport = failure_log.hook("multinode")

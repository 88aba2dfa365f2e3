# -*- coding: utf-8 -*-
"""Each failed check is also written to reports/molecule-multinode-failure.txt, which the Makefile prints after
molecule's own output, so the end of a CI log says what failed."""
from __future__ import annotations

import os

FAILURES = os.path.join(os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd()), "reports",
                        "molecule-multinode-failure.txt")


def pytest_runtest_logreport(report):
    if report.failed:
        os.makedirs(os.path.dirname(FAILURES), exist_ok=True)
        with open(FAILURES, "a", encoding="utf-8") as handle:
            handle.write("molecule multinode: %s failed (%s)\n%s\n\n" % (report.nodeid, report.when,
                                                                     report.longreprtext[-3000:]))

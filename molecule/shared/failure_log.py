# -*- coding: utf-8 -*-
"""Each failed check of a molecule verifier is also written to reports/molecule-<scenario>-failure.txt, which the
Makefile prints after molecule's own output, so the end of a CI log says what failed. A scenario's tests/conftest.py
takes its hook from here: ``pytest_runtest_logreport = failure_log.hook("<scenario>")``."""
from __future__ import annotations

import os


def hook(scenario: str):
    failures = os.path.join(os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd()), "reports",
                            "molecule-%s-failure.txt" % scenario)

    def pytest_runtest_logreport(report):
        if report.failed:
            os.makedirs(os.path.dirname(failures), exist_ok=True)
            with open(failures, "a", encoding="utf-8") as handle:
                handle.write("molecule %s: %s failed (%s)\n%s\n\n" % (scenario, report.nodeid, report.when,
                                                                   report.longreprtext[-3000:]))

    return pytest_runtest_logreport

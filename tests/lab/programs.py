"""What runs through `labctl` (tests/lab/labctl): the lab's own commands (labctl.py: up, down, status, ...) and the
lab's programs below, each imported only when it runs, so that `pct` (called for every command a playbook runs in a
container) loads nothing of labctl's.

  labctl pct ...                          the simulated node's pct (/usr/sbin/pct execs it; pve/pct.py)
  labctl api [--node N] [--daemon] ...    the PVE API server of node N (pve/api.py; `labctl up` starts it)
  labctl task-worker JSON                 one PVE task's worker process (pve/pvetasks.py spawn_task)
  labctl gpu up|down|status               the GPU simulator (gpu/labgpu.py; `labctl up` runs `gpu up`)
  labctl fault ...                        the GPU simulator's fault injection (gpu/fault.py)

A program's arguments are its own, and it acts as the node it is started for (pct over SSH to pve2, pve2's API
server), where labctl's own commands act as pve1.
"""
from __future__ import annotations


def pct(argv: list[str]) -> int:
    from pve import pct
    return pct.main(argv)


def api(argv: list[str]) -> int:
    from pve import api
    return api.main(argv)


def task_worker(argv: list[str]) -> int:
    from pve import pvetasks
    return pvetasks.main(["worker"] + argv)


def gpu(argv: list[str]) -> int:
    from gpu import labgpu
    return labgpu.main(argv)


def fault(argv: list[str]) -> int:
    from gpu import fault
    return fault.main(argv)


PROGRAMS = {"pct": pct, "api": api, "task-worker": task_worker, "gpu": gpu, "fault": fault}


def main(argv: list[str]) -> int:
    if argv and argv[0] in PROGRAMS:
        return PROGRAMS[argv[0]](argv[1:])
    import labctl
    return labctl.main(argv)

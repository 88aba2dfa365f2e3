"""The lab's simulated Proxmox VE node, imported from the lab's root, tests/lab (docs/lab.md, "The lab's code").

Runs with the node's /usr/bin/python3 (3.11, stdlib only). Every behaviour that imitates PVE names its source in
docs/lab.md ("PVE node: behaviours and sources"); "PVE:" comments point at the same places in
/work/shared/reference/proxmox-lxc.md.

The backend that the REST API (api.py) and pct (pct.py) share, by concern (each imports the others as modules, so
that set_node and a test's monkeypatch of a module's name reach every reader):
  pvenode     the node this process acts as (set_node), the lab's paths, PVE's release, PVEError
  pvecluster  members (corosync.conf), the VMID list, quorum
  ctconfig    /etc/pve/nodes/<node>/lxc/<vmid>.conf: parse, format, digest, lock
  ctoptions   option parsing and validation against PVE's schema (apischema.py)
  access      users, API tokens, privileges
  pvetasks    UPIDs, task logs and status, a task's worker process
  ctstate     a CT's state as LXC shows it, cgroups, pressure, vm_status
  lxcconf     the PVE config translated into a real LXC config
  taskops     the operations that run as tasks (create, start, stop, shutdown, reboot, destroy)
  ctapi       the synchronous CT operations (create, config update, config and pending reads, unlock)
  nodeapi     what the node and the cluster report (status, storages, network, resources, templates)
Beside them: nodens.py (a node's mount namespace), template.py (the CT template), make_apislice.py (the schema cut).
"""

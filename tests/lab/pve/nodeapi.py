"""What the node and the cluster report: node status, storages, network, cluster status and resources, snapshots,
the CT's interfaces, templates.

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess

from pve import apischema, ctconfig, ctoptions, ctstate, pvecluster, pvenode


def node_status() -> dict:
    mi = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            mi[k] = int(v.split()[0]) * 1024
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    with open("/proc/uptime") as f:
        uptime = int(float(f.read().split()[0]))
    u = os.uname()
    total = mi["MemTotal"]
    avail = mi.get("MemAvailable", mi["MemFree"])
    return {
        "memory": {"total": total, "used": total - avail, "free": avail, "available": avail},
        "swap": {"total": mi.get("SwapTotal", 0), "free": mi.get("SwapFree", 0),
                 "used": mi.get("SwapTotal", 0) - mi.get("SwapFree", 0)},
        "uptime": uptime, "loadavg": load, "cpu": node_cpu_fraction(),
        "cpuinfo": {"cpus": os.cpu_count(), "cores": os.cpu_count(), "sockets": 1, "model": "lab"},
        "kversion": f"{u.sysname} {u.release} {u.version}", "pveversion": f"pve-manager/{pvenode.PVE_VERSION['version']}/{pvenode.PVE_VERSION['repoid']}",
        "rootfs": {"total": shutil.disk_usage("/").total, "used": shutil.disk_usage("/").used,
                   "free": shutil.disk_usage("/").free},
    }


def node_cpu_fraction() -> float:
    """The node's CPU use since boot as a fraction (PVE's `cpu` is the rrd's recent fraction; the lab has no
    rrd, so the average since boot stands in for it)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    total = sum(vals[:8]) or 1
    return round(1 - (vals[3] + vals[4]) / total, 4)


def _storage_usage(sid: str) -> dict:
    path = pvenode.STORAGES[sid]["path"]
    os.makedirs(path, exist_ok=True)
    du = shutil.disk_usage(path)
    return {"total": du.total, "used": du.used, "avail": du.free}


def storage_digest() -> str:
    """The digest of storage.cfg (a SHA1 of the file); the lab renders its STORAGES as storage.cfg lines."""
    text = "".join(f"{v['type']}: {k}\n\tpath {v['path']}\n\tcontent {v['content']}\n\n" for k, v in pvenode.STORAGES.items())
    return hashlib.sha1(text.encode()).hexdigest()


def storage_config(sid: str) -> dict:
    """GET /storage/{storage} (pve-storage src/PVE/API2/Storage/Config.pm `$api_storage_config`): the section
    with `storage`, `digest` and `content` as a string; an unknown ID: `storage '<id>' does not exist`."""
    if sid not in pvenode.STORAGES:
        raise pvenode.PVEError(f"storage '{sid}' does not exist")
    v = pvenode.STORAGES[sid]
    res = {"storage": sid, "type": v["type"], "content": v["content"], "digest": storage_digest()}
    if v["type"] == "dir":
        res["path"] = v["path"]
    else:
        res.update(vgname="pve", thinpool="data")  # the lab keeps an lvmthin storage in a directory
    return res


def node_storage_list(p: dict) -> list:
    """GET /nodes/{node}/storage (pve-storage src/PVE/API2/Storage/Status.pm index): storages supporting any of
    `content`, only `storage`, `enabled`; `target` = this node or localhost is no target (501 otherwise)."""
    target = p.get("target")
    if target and target not in (pvenode.NODE, "localhost"):
        raise pvenode.PVEError("lab: parameter 'target' is not simulated by the lab (only this node)", 501)
    wanted = set(apischema.split_list(p.get("content")))
    if p.get("storage") and p["storage"] not in pvenode.STORAGES:
        raise pvenode.param_error({"storage": "No such storage."})
    res = []
    for sid, v in sorted(pvenode.STORAGES.items()):
        content = set(v["content"].split(","))
        if wanted and not wanted & content or p.get("storage") and p["storage"] != sid:
            continue
        u = _storage_usage(sid)
        res.append({"storage": sid, "type": v["type"], "content": v["content"], "active": 1, "enabled": 1,
                    "shared": 0, **u, "used_fraction": u["used"] / u["total"] if u["total"] else 0})
    return res


def storage_content(sid: str, content: str | None, vmid) -> list:
    """GET /nodes/{node}/storage/{storage}/content: templates of `local` (vztmpl) and the CTs' root volumes
    (rootdir); `content` and `vmid` filter (a template belongs to no guest)."""
    if sid not in pvenode.STORAGES:
        raise pvenode.PVEError(f"storage '{sid}' does not exist")
    res = []
    if sid == "local":
        res += template_list()
    for ct in ctstate.list_cts():
        with contextlib.suppress(pvenode.PVEError):
            rootfs = ctconfig.load_config(ct).get("rootfs", "")
            d = ctoptions.parse_prop_string(rootfs, "volume")
            if d.get("volume", "").startswith(f"{sid}:"):
                size = apischema.parse_size(d.get("size", "0")) or 0
                res.append({"volid": d["volume"], "content": "rootdir", "vmid": ct, "size": size,
                            "format": "raw", "ctime": int(os.path.getmtime(pvenode.conf_path(ct)))})
    if content:
        res = [r for r in res if r["content"] == content]
    if vmid:
        res = [r for r in res if str(r.get("vmid", "")) == str(vmid)]
    return res


def node_network(type_filter: str | None) -> list:
    """GET /nodes/{node}/network (pve-manager PVE/API2/Network.pm index): the simulated node's interfaces are
    its bridge vmbr0 (docs/lab.md, "Network"); `type` keeps those of the type, any_bridge and any_local_bridge
    the bridges."""
    addr, bits = pvenode.BRIDGE_ADDR.split("/")
    iface = {"iface": pvenode.BRIDGE, "type": "bridge", "method": "static", "families": ["inet"], "autostart": 1,
             "active": 1 if os.path.isdir(f"/sys/class/net/{pvenode.BRIDGE}") else 0, "exists": 1,
             "address": addr, "netmask": bits, "cidr": pvenode.BRIDGE_ADDR, "bridge_ports": "", "bridge_stp": "off",
             "bridge_fd": "0", "priority": 1}
    if type_filter and not (type_filter == "bridge" or re.fullmatch(r"any(_local)?_bridge", type_filter)):
        return []
    return [iface]


def cluster_status() -> list:
    """GET /cluster/status (pve-manager PVE/API2/Cluster.pm get_status): with a cluster, its entry (`nodes`,
    `version`, `name`, `quorate`) and one per member (`nodeid`, `local`, `online`, `ip`, `level` when online);
    without one, the "fake entry for local node if no cluster defined"."""
    nodes = pvecluster.cluster_nodes()
    if not nodes:
        return [{"type": "node", "id": f"node/{pvenode.NODE}", "name": pvenode.NODE, "ip": pvenode.NODE_ADDRESSES[pvenode.NODE], "local": 1,
                 "nodeid": 0, "online": 1, "level": ""}]
    res = [{"type": "cluster", "id": "cluster", "nodes": len(nodes), "version": len(nodes), "name": pvenode.CLUSTER_NAME,
            "quorate": 1 if pvecluster.is_quorate() else 0}]
    for n in nodes:
        online = pvecluster.node_online(n["name"])
        entry = {"type": "node", "id": f"node/{n['name']}", "name": n["name"], "nodeid": n["nodeid"],
                 "local": 1 if n["name"] == pvenode.NODE else 0, "online": 1 if online else 0, "ip": n["ip"]}
        if online:
            entry["level"] = ""
        res.append(entry)
    return res


def node_names() -> list[str]:
    """The cluster's nodes, or this node without a cluster."""
    return [n["name"] for n in pvecluster.cluster_nodes()] or [pvenode.NODE]


def node_entry(node: str) -> dict:
    """pve-manager PVE/API2Tools.pm extract_node_stats: the stats of an online node, `status offline` and only
    the maxima for a member that is not online. All lab nodes share this machine's memory, CPUs and disk."""
    ns = node_status()
    entry = {"id": f"node/{node}", "node": node, "type": "node", "status": "online", "level": "",
             "maxcpu": ns["cpuinfo"]["cpus"], "maxmem": ns["memory"]["total"], "maxdisk": ns["rootfs"]["total"]}
    if pvecluster.node_online(node):
        entry.update(uptime=ns["uptime"], cpu=ns["cpu"], mem=ns["memory"]["used"], disk=ns["rootfs"]["used"])
    else:
        entry["status"] = "offline"
    return entry


def cluster_resources(type_filter: str | None) -> list:
    """GET /cluster/resources (pve-manager PVE/API2/Cluster.pm resources; PVE/API2Tools.pm extract_vm_stats,
    extract_node_stats, extract_storage_stats): the guests of every node (the cluster's VMID list), then the
    nodes, then each node's storages."""
    res = []
    if type_filter in (None, "", "vm"):
        for vmid, node in sorted(pvecluster.vmlist().items()):
            if node not in node_names():
                continue
            try:
                st = ctstate.vm_status(vmid, node)
            except pvenode.PVEError:  # removed meanwhile
                continue
            entry = {"id": f"lxc/{vmid}", "vmid": vmid, "node": node, "type": "lxc", "status": st["status"],
                     "uptime": st["uptime"], "name": st["name"], "template": st.get("template", 0),
                     "maxcpu": st["cpus"], "cpu": st["cpu"], "maxmem": st["maxmem"], "mem": st["mem"],
                     "maxdisk": st["maxdisk"], "disk": st["disk"], "netin": st["netin"], "netout": st["netout"],
                     "diskread": st["diskread"], "diskwrite": st["diskwrite"]}
            if st.get("tags"):
                entry["tags"] = st["tags"]
            if st.get("lock"):
                entry["lock"] = st["lock"]
            res.append(entry)
    if type_filter in (None, "", "node"):
        for node in node_names():
            entry = node_entry(node)
            if entry["status"] == "online":
                entry["cgroup-mode"] = 1
            res.append(entry)
    if type_filter in (None, "", "storage"):
        for node in node_names():
            for sid, v in sorted(pvenode.STORAGES.items()):
                u = _storage_usage(sid)
                entry = {"id": f"storage/{node}/{sid}", "storage": sid, "node": node, "type": "storage",
                         "plugintype": v["type"], "status": "available", "shared": 0, "content": v["content"],
                         "maxdisk": u["total"], "disk": u["used"]}
                if not pvecluster.node_online(node):
                    entry = {k: entry[k] for k in ("id", "storage", "node", "type", "plugintype", "shared",
                                                   "content")}
                    entry["status"] = "unknown"
                res.append(entry)
    return res


def snapshot_list(vmid) -> list:
    """GET /nodes/{node}/lxc/{vmid}/snapshot (pve-container src/PVE/API2/LXC/Snapshot.pm list): the lab's CTs
    have no snapshots (taking one is not simulated), so only `current`."""
    conf = ctconfig.load_config(int(vmid))
    return [{"name": "current", "digest": conf["digest"], "running": 1 if ctstate.is_running(int(vmid)) else 0,
             "description": "You are here!"}]


def ct_interfaces(vmid):
    """GET /nodes/{node}/lxc/{vmid}/interfaces (pve-container src/PVE/LXC.pm get_interfaces): `ip --json a` in the
    CT's network namespace; null for a stopped CT."""
    ctconfig.load_config(int(vmid))
    state, pid = ctstate.lxc_info(int(vmid))
    if state != "running" or not pid:
        return None
    r = subprocess.run(["nsenter", "-t", str(pid), "--net", "--", "ip", "--json", "a"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise pvenode.PVEError(f"command 'nsenter -t {pid} --net -- ip --json a' failed: exit code {r.returncode}")
    res = []
    for itf in json.loads(r.stdout or "[]"):
        obj = {"name": itf["ifname"]}
        addrs = []
        for ip in itf.get("addr_info", []):
            obj[ip["family"]] = f"{ip['local']}/{ip['prefixlen']}"
            addrs.append({"ip-address-type": ip["family"], "ip-address": ip["local"], "prefix": ip["prefixlen"]})
        obj["ip-addresses"] = addrs
        obj["hardware-address"] = itf.get("address")
        obj["hwaddr"] = itf.get("address")
        res.append(obj)
    return res


def template_list() -> list:
    res = []
    if os.path.isdir(pvenode.TMPL_DIR):
        for name in sorted(os.listdir(pvenode.TMPL_DIR)):
            if name.endswith((".tar.zst", ".tar.gz", ".tar.xz")):
                p = f"{pvenode.TMPL_DIR}/{name}"
                res.append({"volid": f"local:vztmpl/{name}", "content": "vztmpl", "format": name.split(".", 1)[1],
                            "size": os.path.getsize(p), "ctime": int(os.path.getmtime(p))})
    return res

#!/usr/bin/env python3
"""Regenerates a schema slice: the methods of PVE's API schema that the lab serves, cut from pve-docs'
api-viewer/apidata.js (the schema pve-docs dumps from a PVE build; JSON once `const apiSchema =` is stripped).

The lab's own profile, apidata-slice.json (the release the lab reports, pvenode.PVE_VERSION, 9.1):

    git -C pve-docs show a8736b6d6169ea9679ee02285ea36fdab42e85c3:api-viewer/apidata.js > /tmp/apidata.js
    python3 tests/lab/pve/make_apislice.py /tmp/apidata.js a8736b6d6169ea9679ee02285ea36fdab42e85c3

a8736b6 is pve-docs' newest "update static/schema information" (2026-04-30, the day of its "bump version to
9.1.3", e5010dc); pve-manager was at 9.1.9 then. The second profile, apidata-slice-8.4.json, which the API
checks every request against as well (apischema.PROFILES, docs/lab.md "PVE's schema"):

    git -C pve-docs show 46601a32456cd5fd98f0433912dbd811984866f2:api-viewer/apidata.js > /tmp/apidata-8.4.js
    python3 tests/lab/pve/make_apislice.py /tmp/apidata-8.4.js 46601a32456cd5fd98f0433912dbd811984866f2 8.4

46601a3 is pve-docs' "update static/schema information" of 2025-04-09, the day of its "bump version to 8.4.0"
(a3479f7). Stdlib only.
"""
from __future__ import annotations

import json
import os
import sys

SOURCE = "github.com/proxmox/pve-docs api-viewer/apidata.js"
HERE = os.path.dirname(os.path.abspath(__file__))


def out_path(profile: str | None) -> str:
    """apidata-slice.json for the lab's own profile, apidata-slice-<profile>.json for another."""
    return os.path.join(HERE, f"apidata-slice-{profile}.json" if profile else "apidata-slice.json")


# Every method the lab's API serves (api.py routes exactly these; anything else is 501).
ENDPOINTS = [
    ("GET", "/version"),
    ("GET", "/access/ticket"),
    ("POST", "/access/ticket"),
    ("GET", "/cluster/resources"),
    ("GET", "/cluster/nextid"),
    ("GET", "/cluster/status"),
    ("GET", "/storage"),
    ("GET", "/storage/{storage}"),
    ("GET", "/nodes"),
    ("GET", "/nodes/{node}/status"),
    ("GET", "/nodes/{node}/version"),
    ("GET", "/nodes/{node}/network"),
    ("GET", "/nodes/{node}/storage"),
    ("GET", "/nodes/{node}/storage/{storage}/content"),
    ("GET", "/nodes/{node}/qemu"),
    ("GET", "/nodes/{node}/tasks"),
    ("GET", "/nodes/{node}/tasks/{upid}"),
    ("DELETE", "/nodes/{node}/tasks/{upid}"),
    ("GET", "/nodes/{node}/tasks/{upid}/status"),
    ("GET", "/nodes/{node}/tasks/{upid}/log"),
    ("GET", "/nodes/{node}/lxc"),
    ("POST", "/nodes/{node}/lxc"),
    ("GET", "/nodes/{node}/lxc/{vmid}"),
    ("DELETE", "/nodes/{node}/lxc/{vmid}"),
    ("GET", "/nodes/{node}/lxc/{vmid}/config"),
    ("PUT", "/nodes/{node}/lxc/{vmid}/config"),
    ("GET", "/nodes/{node}/lxc/{vmid}/pending"),
    ("GET", "/nodes/{node}/lxc/{vmid}/status"),
    ("GET", "/nodes/{node}/lxc/{vmid}/status/current"),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/start"),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/stop"),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/shutdown"),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/reboot"),
    ("GET", "/nodes/{node}/lxc/{vmid}/snapshot"),
    ("GET", "/nodes/{node}/lxc/{vmid}/interfaces"),
]


def load_apidata(path: str) -> list:
    with open(path) as f:
        raw = f.read()
    return json.loads(raw[raw.index("["):raw.rindex("]") + 1])


def methods(tree: list) -> dict:
    res = {}

    def walk(node):
        for method, info in (node.get("info") or {}).items():
            res[f"{method} {node['path']}"] = info
        for child in node.get("children") or []:
            walk(child)

    for node in tree:
        walk(node)
    return res


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    allm = methods(load_apidata(argv[0]))
    missing = [f"{m} {p}" for m, p in ENDPOINTS if f"{m} {p}" not in allm]
    if missing:
        print(f"not in this apidata.js: {missing}", file=sys.stderr)
        return 1
    out_file = out_path(argv[2] if len(argv) == 3 else None)
    out = {"source": SOURCE, "commit": argv[1], "methods_in_source": len(allm),
           "methods": {f"{m} {p}": allm[f"{m} {p}"] for m, p in ENDPOINTS}}
    with open(out_file, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{out_file}: {len(ENDPOINTS)} of {len(allm)} methods, {os.path.getsize(out_file)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

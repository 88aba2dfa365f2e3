"""Does requirements.txt alone make a controller that can run deploy.yml and recover.yml?

Run with the Python of a virtualenv built from requirements.txt and nothing else (`make
controller-requirements`). It checks, and prints one line per check:
  1. `ansible-playbook --syntax-check` of both playbooks passes (every role, module, filter and
     collection they name is found);
  2. every third-party module imported anywhere by this collection's plugins, and by the plugins of
     other collections that our roles, playbooks and inventories name (followed through their
     module_utils), imports in this interpreter: an optional `try: import paramiko` counts, since the
     task that needs it fails without it.
Exit 0 when everything passes, 1 otherwise (with what is missing and what to add).
"""
from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys

REPO = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PLAYBOOKS = ["playbooks/deploy.yml", "playbooks/recover.yml"]
FQCN = re.compile(r"\b(community|ansible)\.([a-z0-9_]+)\.([a-z0-9_]+)\b")
SCAN = ["roles", "playbooks", "inventories"]


def site_collections() -> str:
    import ansible_collections  # the `ansible` package's collections, in this virtualenv
    return os.path.dirname(ansible_collections.__file__) if ansible_collections.__file__ else \
        list(ansible_collections.__path__)[0]


def external_plugins(root: str) -> set[str]:
    """Files of the other collections' plugins that our YAML names by FQCN."""
    found = set()
    for top in SCAN:
        for dirpath, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if not name.endswith((".yml", ".yaml", ".j2")):
                    continue
                with open(os.path.join(dirpath, name), errors="replace") as f:
                    text = f.read()
                for ns, coll, plugin in FQCN.findall(text):
                    if ns == "ansible" and coll == "builtin":
                        continue
                    base = os.path.join(root, ns, coll, "plugins")
                    if not os.path.isdir(base):
                        continue
                    for kind in os.listdir(base):
                        path = os.path.join(base, kind, plugin + ".py")
                        if os.path.isfile(path):
                            found.add(path)
    return found


def imports_of(path: str) -> tuple[set[str], set[str]]:
    """(third-party top-level names, ansible_collections module names) imported anywhere in the file."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    third, colls = set(), set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top == "ansible_collections":
                colls.add(name)
            elif top not in sys.stdlib_module_names and top not in ("ansible", "__future__"):
                third.add(top)
    return third, colls


def collection_file(module: str, roots: list[str]) -> str | None:
    rel = module.split(".")[1:]
    for root in roots:
        for cand in (os.path.join(root, *rel) + ".py", os.path.join(root, *rel, "__init__.py")):
            if os.path.isfile(cand):
                return cand
    return None


def main() -> int:
    ok = True
    bindir = os.path.dirname(sys.executable)
    for pb in PLAYBOOKS:
        r = subprocess.run([os.path.join(bindir, "ansible-playbook"), "--syntax-check", pb], cwd=REPO,
                           capture_output=True, text=True)
        print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} ansible-playbook --syntax-check {pb}")
        if r.returncode != 0:
            ok = False
            print((r.stdout + r.stderr).strip())
    site = site_collections()
    ours = os.path.join(REPO, ".collections", "ansible_collections")
    todo = [os.path.join(dp, n) for dp, _, fs in os.walk(os.path.join(REPO, "plugins")) for n in fs if n.endswith(".py")]
    todo += sorted(external_plugins(site))
    seen: set[str] = set()
    needed: dict[str, set[str]] = {}
    while todo:
        path = os.path.realpath(todo.pop())
        if path in seen:
            continue
        seen.add(path)
        third, colls = imports_of(path)
        for name in third:
            needed.setdefault(name, set()).add(os.path.relpath(path, REPO if path.startswith(REPO) else site))
        for mod in colls:
            f = collection_file(mod, [ours, site]) or collection_file(mod.rsplit(".", 1)[0], [ours, site])
            if f:
                todo.append(f)
    # Imported only when used: proxmoxer loads its HTTPS backend (and requests) at connection time.
    needed.setdefault("proxmoxer.backends.https", set()).add("plugins/modules/pve_lxc.py (ProxmoxAPI over HTTPS)")
    print(f"     {len(seen)} plugin and module_utils files read; third-party imports: {', '.join(sorted(needed))}")
    for name in sorted(needed):
        try:
            importlib.import_module(name)
            print(f"ok   import {name}")
        except ImportError as e:
            ok = False
            print(f"FAIL import {name} ({e}), needed by {', '.join(sorted(needed[name]))}: add it to requirements.txt")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

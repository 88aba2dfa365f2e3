#!/usr/bin/env python3
"""Rewrite references to plugins/module_utils files after their move into domain packages.

One-off migration aid (kept for branches made before the move): `--apply FILE...` rewrites imports, dotted names and
paths in the given files; `--move` does the git moves in the checkout it runs in.
"""
import argparse
import os
import re
import subprocess
import sys

DOMAINS = {
    "common": ["errors", "safe_text", "report_artifact"],
    "host": ["gpu_facts", "node_facts", "procfs", "bounded_command"],
    "sizing": ["hicache", "hicache_explain", "hicache_geometry", "hicache_input", "hicache_model", "hicache_pools",
               "hicache_releases", "node_plan", "overhead_offer", "sizing_values"],
    "deploy": ["sglang_deploy", "sglang_extra_vars", "sglang_request", "playbook_inputs", "adopt", "supply_chain",
               "managed_files", "ssh_host_keys"],
    "recover": ["recover_baseline", "recover_daemons", "recover_gate", "recover_kernel", "recover_ladder",
                "recover_procs", "recover_pve", "recover_scope", "recover_signals", "recover_smi", "eda_watch",
                "metrics_textfile"],
    "pve": ["pve_api", "pve_client", "pve_config", "pve_gpu_devices", "pve_options"],
}
DOMAIN_OF = {name: domain for domain, names in DOMAINS.items() for name in names}
# Unit tests whose subject is not in their name.
TEST_DOMAIN = {"test_failure_result": "deploy", "test_input_values": "deploy", "test_unit_values": "deploy",
               "test_hicache_attn_dp_draft_post": "sizing", "test_hicache_parts": "sizing",
               "test_hicache_reserve": "sizing"}
PKG = "ansible_collections.inferops.gpu_inference.plugins.module_utils"
_NAMES = "|".join(sorted(DOMAIN_OF, key=len, reverse=True))

_FROM_MULTI = re.compile(r"^(?P<indent>[ \t]*)from " + re.escape(PKG) + r" import (?P<names>[A-Za-z_][\w ,]*?)(?P<tail>[ \t]*(#.*)?)$",
                         re.M)
_FROM_PAREN = re.compile(r"^(?P<indent>[ \t]*)from " + re.escape(PKG) + r" import \((?P<names>[^)]*)\)", re.M)
_DOTTED = re.compile(re.escape(PKG) + r"\.(" + _NAMES + r")\b")
_PATH = re.compile(r"(?<![\w/])((?:plugins/)?module_utils/)(" + _NAMES + r")(\.py\b|\b)")
_TEST_PATH = re.compile(r"(tests/unit/plugins/module_utils/)(test_\w+)(\.py)")


def test_domain(stem):
    if stem in TEST_DOMAIN:
        return TEST_DOMAIN[stem]
    base = stem[len("test_"):]
    for name in sorted(DOMAIN_OF, key=len, reverse=True):
        if base == name or base.startswith(name + "_"):
            return DOMAIN_OF[name]
    return None


def _split_from(match):
    indent, names, tail = match.group("indent"), match.group("names"), match.group("tail")
    items = [n.strip() for n in names.split(",") if n.strip()]
    groups = {}
    for item in items:
        base = item.split(" as ")[0].strip()
        key = DOMAIN_OF.get(base)
        groups.setdefault(key, []).append(item)
    if list(groups) == [None]:
        return match.group(0)
    lines = []
    for i, (domain, group) in enumerate(groups.items()):
        mod = PKG if domain is None else PKG + "." + domain
        lines.append("%sfrom %s import %s%s" % (indent, mod, ", ".join(group), tail if i == 0 else tail))
    return "\n".join(lines)


def _split_paren(match):
    names = " ".join(line.split("#")[0] for line in match.group("names").splitlines())
    one = "%sfrom %s import %s" % (match.group("indent"), PKG, ", ".join(n.strip() for n in names.split(",") if n.strip()))
    return _FROM_MULTI.sub(_split_from, one)


def rewrite(text):
    text = _FROM_PAREN.sub(_split_paren, text)
    text = _FROM_MULTI.sub(_split_from, text)
    text = _DOTTED.sub(lambda m: PKG + "." + DOMAIN_OF[m.group(1)] + "." + m.group(1), text)
    text = _PATH.sub(lambda m: m.group(1) + DOMAIN_OF[m.group(2)] + "/" + m.group(2) + m.group(3), text)

    def _test(m):
        domain = test_domain(m.group(2))
        return m.group(0) if domain is None else m.group(1) + domain + "/" + m.group(2) + m.group(3)
    return _TEST_PATH.sub(_test, text)


def move(root):
    mu = os.path.join(root, "plugins", "module_utils")
    tu = os.path.join(root, "tests", "unit", "plugins", "module_utils")
    for domain, names in DOMAINS.items():
        os.makedirs(os.path.join(mu, domain), exist_ok=True)
        open(os.path.join(mu, domain, "__init__.py"), "a").close()
        for name in names:
            src = os.path.join(mu, name + ".py")
            if os.path.exists(src):
                subprocess.check_call(["git", "mv", src, os.path.join(mu, domain, name + ".py")], cwd=root)
    for fname in sorted(os.listdir(tu)):
        stem, ext = os.path.splitext(fname)
        domain = test_domain(stem) if stem.startswith("test_") and ext == ".py" else None
        if domain:
            os.makedirs(os.path.join(tu, domain), exist_ok=True)
            subprocess.check_call(["git", "mv", os.path.join(tu, fname), os.path.join(tu, domain, fname)], cwd=root)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--move", action="store_true")
    ap.add_argument("--apply", nargs="*", default=[])
    args = ap.parse_args()
    if args.move:
        move(os.getcwd())
    changed = 0
    for path in args.apply:
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = rewrite(old)
        if new != old:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            changed += 1
            print("rewrote", path)
    print("%d file(s) rewritten" % changed, file=sys.stderr)


if __name__ == "__main__":
    main()

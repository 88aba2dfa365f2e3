"""docs/development.md's "Layout" names every plugin, role, playbook, event source and molecule scenario that exists.

A plugin added without a word in the layout fails here, so the map a newcomer reads stays true to the tree."""
import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def layout_block() -> str:
    with open(os.path.join(REPO, "docs", "development.md")) as f:
        text = f.read()
    start = text.index("## Layout")
    block = text[start:text.index("## ", start + 3)]
    return block[block.index("```") + 3:block.rindex("```")]


def sections(block: str) -> dict:
    """Each `name/` heading of the block with the text of its lines (continuation lines included)."""
    found, current = {}, None
    for line in block.splitlines():
        m = re.match(r"^\s*([a-z_/]+/)\s", line)
        if m:
            current = m.group(1).rstrip("/").split("/")[-1]
            found[current] = ""
        if current:
            found[current] += " " + line
    return found


def names(folder: str, ext: str) -> set:
    path = os.path.join(REPO, folder)
    return {f[: -len(ext)] for f in os.listdir(path) if f.endswith(ext) and not f.startswith("__")}


def words(text: str) -> set:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def test_every_plugin_is_in_its_line():
    found = sections(layout_block())
    missing = []
    for kind in ("modules", "action", "filter", "connection", "doc_fragments", "plugin_utils"):
        assert kind in found, "docs/development.md's layout has no %s/ line" % kind
        missing += ["plugins/%s/%s.py" % (kind, n) for n in sorted(names("plugins/" + kind, ".py") - words(found[kind]))]
    assert not missing, "docs/development.md's layout does not name: %s" % ", ".join(missing)


def test_roles_playbooks_scenarios_and_event_sources_are_named():
    block = words(layout_block())
    expected = {"role " + r: r for r in os.listdir(os.path.join(REPO, "roles"))}
    expected.update({"playbook " + p: p for p in names("playbooks", ".yml")})
    expected.update({"molecule scenario " + m: m for m in os.listdir(os.path.join(REPO, "molecule"))})
    expected.update({"event source " + e: e for e in names("extensions/eda/plugins/event_source", ".py")})
    missing = sorted(k for k, v in expected.items() if v not in block)
    assert not missing, "docs/development.md's layout does not name: %s" % ", ".join(missing)


def test_every_module_utils_file_is_named_under_its_domain():
    """The layout's module_utils line names each domain package and, inside its parentheses, each file of it."""
    found = sections(layout_block())
    assert "module_utils" in found, "docs/development.md's layout has no module_utils/ line"
    text = found["module_utils"]
    root = os.path.join(REPO, "plugins", "module_utils")
    domains = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("__"))
    missing = []
    for domain in domains:
        m = re.search(r"\b%s/\s*\(([^)]*)\)" % re.escape(domain), text)
        if not m:
            missing.append("plugins/module_utils/%s/" % domain)
            continue
        listed = m.group(1)
        for name in sorted(names("plugins/module_utils/" + domain, ".py")):
            # A family may be named by its prefix: hicache_* covers hicache_model.
            if name not in words(listed) and not any(name.startswith(p) for p in re.findall(r"(\w+_)\*", listed)):
                missing.append("plugins/module_utils/%s/%s.py" % (domain, name))
    assert not missing, "docs/development.md's layout does not name: %s" % ", ".join(missing)
    flat = sorted(names("plugins/module_utils", ".py"))
    assert not flat, "module_utils files outside a domain package: %s" % ", ".join(flat)


def test_the_decision_table_names_files_that_exist():
    """Every `domain/file.py` the document points at exists, so a reader following it lands on the code."""
    with open(os.path.join(REPO, "docs", "development.md")) as f:
        text = f.read()
    cited = set(re.findall(r"`((?:common|host|sizing|deploy|recover|pve)/\w+\.py)`", text))
    assert cited, "docs/development.md cites no module_utils file"
    missing = sorted(c for c in cited if not os.path.isfile(os.path.join(REPO, "plugins", "module_utils", c)))
    assert not missing, "docs/development.md cites files that do not exist: %s" % ", ".join(missing)

# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Managed files compared in one round trip: the controller's SHA-256 of every file a task manages,
the target's state of all of them read by one command (``REMOTE_SCRIPT``, op ``read``), and what must change
(``plan``): a copy where the content differs or the file is missing, an attribute fix where only the mode or the
owner does. The copies go one connection transfer each, then one command installs them all (op ``install``:
owner and mode set on a temporary file beside the destination, then an atomic rename), so a run that changes
nothing costs one command however many files it manages.

The action plugin inferops.gpu_inference.managed_files is the thin part; no Ansible imports here.
Unit-tested in tests/unit/plugins/module_utils/deploy/test_managed_files.py.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.safe_text import control_char
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError


class ManagedFilesError(InferopsError):
    """A bad argument: reported before anything is changed."""


CHUNK = 1024 * 1024
TMP_SUFFIX = ".inferops-managed.tmp"
# --diff shows the text of inline content up to this size (a unit, a JSON launch record); larger: digests only.
TEXT_DIFF_MAX_BYTES = 256 * 1024


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_mode(value: Any, what: str) -> int:
    """An octal mode given as a string ("0644", "644") or an int already meant as octal digits is refused."""
    text = str(value).strip()
    if not isinstance(value, str) or not text or any(c not in "01234567" for c in text) or len(text) > 4:
        raise ManagedFilesError("%s must be an octal mode given as a quoted string such as '0644', got %r" % (what, value))
    return int(text, 8)


def _abs_dest(dest: Any, what: str) -> str:
    if not isinstance(dest, str) or not dest.startswith("/") or "\0" in dest:
        raise ManagedFilesError("%s must be an absolute path, got %r" % (what, dest))
    # A path is passed to the target quoted (the connection, the JSON of REMOTE_SCRIPT), but a line break in it would
    # still end a line of the logs, the reports and the unit files that name it: refused, whatever else it contains.
    found = control_char(dest)
    if found is not None:
        raise ManagedFilesError("%s %r contains the control character %s: a destination path with a line break or "
                                "another control character is refused (nothing was changed); rename the file"
                                % (what, dest, found))
    norm = posixpath.normpath(dest)
    if norm != dest.rstrip("/") or norm == "/":
        raise ManagedFilesError("%s must be a normalised absolute path (no '..', no '//'), got %r" % (what, dest))
    return norm


def _validate_cmd(value: Any, what: str) -> str:
    """A command run on the new file before it replaces the old one (the copy module's ``validate``): %s is the
    temporary file's path; it is split like a shell word list, not run by a shell."""
    if not isinstance(value, str) or "%s" not in value or "\0" in value or "\n" in value:
        raise ManagedFilesError("%s must be a one-line command containing %%s (the new file's path), got %r" % (what, value))
    return value


def directories(dirs: Sequence[Any]) -> list[str]:
    """The directories a task makes (or fixes the mode and owner of) before its files: absolute, normalised."""
    return sorted({_abs_dest(d, "directories[%d]" % i) for i, d in enumerate(dirs or [])})


def expand(files: Sequence[Mapping[str, Any]], trees: Sequence[Mapping[str, Any]], find: Callable[[str], str],
           mode: str, directory_mode: str) -> list[dict[str, Any]]:
    """The managed files, one row each: src (a controller path), dest, mode (int), sha256, size.

    files: [{src, dest, mode?}] (src as a role's files/ lookup resolves it: ``find``; dest the full path, or a
    directory ending in "/" where the file keeps its name);
    trees: [{src, dest}]: every regular file under the controller directory src, at the same relative path under
    dest (the copy module's ``src: dir/`` form). mode/directory_mode: the defaults, octal strings.
    """
    default_mode = parse_mode(mode, "mode")
    parse_mode(directory_mode, "directory_mode")
    rows: list[dict[str, Any]] = []
    files = list(files or [])
    for i, entry in enumerate(files):
        # dest ending in "/" is a directory: the file keeps its name there (the copy module's rule).
        if isinstance(entry, Mapping) and isinstance(entry.get("dest"), str) and entry["dest"].endswith("/") \
                and "src" in entry:
            files[i] = dict(entry, dest=entry["dest"] + posixpath.basename(str(entry["src"]).rstrip("/")))
    for i, entry in enumerate(files):
        if not isinstance(entry, Mapping) or "src" not in entry or "dest" not in entry:
            raise ManagedFilesError("files[%d] must be a mapping with src and dest, got %r" % (i, entry))
        src = find(str(entry["src"]))
        if not os.path.isfile(src):
            raise ManagedFilesError("files[%d].src %s is not a regular file on the controller" % (i, src))
        row = {"src": src, "dest": _abs_dest(entry["dest"], "files[%d].dest" % i),
               "mode": parse_mode(entry["mode"], "files[%d].mode" % i) if "mode" in entry else default_mode,
               "label": str(entry.get("label") or src)}
        if entry.get("text") is not None:
            row["text"] = str(entry["text"])
        if entry.get("validate") is not None:
            row["validate"] = _validate_cmd(entry["validate"], "files[%d].validate" % i)
        for key in ("owner", "group"):
            if entry.get(key) is not None:
                if not isinstance(entry[key], str) or not entry[key] or entry[key].startswith("-") \
                        or any(c in entry[key] for c in ":/ ") or control_char(entry[key]) is not None:
                    raise ManagedFilesError("files[%d].%s must be a user or group name, got %r" % (i, key, entry[key]))
                row[key] = entry[key]
        rows.append(row)
    for i, entry in enumerate(trees or []):
        if not isinstance(entry, Mapping) or "src" not in entry or "dest" not in entry:
            raise ManagedFilesError("trees[%d] must be a mapping with src and dest, got %r" % (i, entry))
        top = find(str(entry["src"]).rstrip("/") or "/")
        if not os.path.isdir(top):
            raise ManagedFilesError("trees[%d].src %s is not a directory on the controller" % (i, top))
        dest_top = _abs_dest(entry["dest"], "trees[%d].dest" % i)
        for root, dirs, names in os.walk(top):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(root, name)
                if not os.path.isfile(path):
                    continue
                rel = os.path.relpath(path, top).replace(os.sep, "/")
                dest = _abs_dest(posixpath.join(dest_top, rel), "trees[%d]: the file %r goes to" % (i, path))
                rows.append({"src": path, "dest": dest, "mode": default_mode, "label": path})
    seen: dict[str, str] = {}
    for row in rows:
        if row["dest"] in seen and seen[row["dest"]] != row["src"]:
            raise ManagedFilesError("%s is the destination of both %s and %s" % (row["dest"], seen[row["dest"]], row["src"]))
        seen[row["dest"]] = row["src"]
    unique = {row["dest"]: row for row in rows}
    for row in unique.values():
        row["sha256"] = sha256_file(row["src"])
        row["size"] = os.path.getsize(row["src"])
    return sorted(unique.values(), key=lambda r: r["dest"])


def read_request(rows: Sequence[Mapping[str, Any]], dirs: Sequence[str] = ()) -> dict[str, Any]:
    """One command reads the state of every file and every managed directory (digests only for files)."""
    return {"op": "read", "paths": [r["dest"] for r in rows] + [d for d in dirs if d not in {r["dest"] for r in rows}]}


def plan_dirs(dirs: Sequence[str], remote: Mapping[str, Any], owner: str, group: str, directory_mode: str) -> dict[str, list]:
    """The managed directories that must be made (missing) or fixed (mode or owner differ)."""
    mode = parse_mode(directory_mode, "directory_mode")
    out: dict[str, list] = {"make": [], "fix": []}
    for d in dirs:
        seen = remote.get(d)
        if not isinstance(seen, Mapping):
            raise ManagedFilesError("the target did not report %s" % d)
        if not seen.get("exists"):
            out["make"].append(d)
        elif not seen.get("is_dir"):
            raise ManagedFilesError("%s exists on the target and is not a directory" % d)
        elif seen.get("mode") != mode or _differs(seen.get("owner"), owner) or _differs(seen.get("group"), group):
            out["fix"].append({"dest": d, "before": {k: seen.get(k) for k in ("exists", "mode", "owner", "group")}})
    return out


def _differs(seen: Any, wanted: Optional[str]) -> bool:
    """An owner or group of None is not managed (the connection's user keeps it: a controller-side report)."""
    return wanted is not None and seen != wanted


def plan(rows: Sequence[Mapping[str, Any]], remote: Mapping[str, Any], owner: str, group: str) -> dict[str, list]:
    """What must change, from the controller's rows and the target's answer to ``read`` ({dest: {exists, is_file,
    sha256, mode, owner, group}}): copy (content differs or missing), fix (mode/owner only), same."""
    out: dict[str, list] = {"copy": [], "fix": [], "same": []}
    default_owner, default_group = owner, group
    for row in rows:
        owner, group = row.get("owner") or default_owner, row.get("group") or default_group
        seen = remote.get(row["dest"])
        if not isinstance(seen, Mapping):
            raise ManagedFilesError("the target did not report %s" % row["dest"])
        if seen.get("exists") and not seen.get("is_file"):
            raise ManagedFilesError("%s exists on the target and is not a regular file" % row["dest"])
        want = {"dest": row["dest"], "src": row["src"], "mode": row["mode"], "sha256": row["sha256"], "size": row["size"],
                "owner": owner, "group": group, "label": row.get("label", row["src"]),
                "validate": row.get("validate"), "text": row.get("text"),
                "before": {k: seen.get(k) for k in ("exists", "sha256", "mode", "owner", "group")}}
        if not seen.get("exists") or seen.get("sha256") != row["sha256"]:
            out["copy"].append(want)
        elif seen.get("mode") != row["mode"] or _differs(seen.get("owner"), owner) or _differs(seen.get("group"), group):
            out["fix"].append(want)
        else:
            out["same"].append(row["dest"])
    return out


def install_request(changes: Mapping[str, list], owner: str, group: str, directory_mode: str) -> dict[str, Any]:
    """The ``install`` op: each copied file was put at dest + TMP_SUFFIX; every copy's digest is checked and its
    ``validate`` command run before any of them is renamed into place (a refused file changes nothing), then owner
    and mode are set and each is renamed; the attributes of the others are fixed."""
    items = [{"dest": c["dest"], "tmp": c["dest"] + TMP_SUFFIX, "mode": c["mode"], "sha256": c["sha256"],
              "owner": c["owner"], "group": c["group"], "validate": c.get("validate")} for c in changes["copy"]]
    items += [{"dest": c["dest"], "tmp": None, "mode": c["mode"], "sha256": c["sha256"], "owner": c["owner"],
               "group": c["group"]} for c in changes["fix"]]
    return {"op": "install", "owner": owner, "group": group, "directory_mode": parse_mode(directory_mode, "directory_mode"),
            "items": items}


def mkdirs_request(changes: Mapping[str, list], owner: str, group: str, directory_mode: str,
                   dir_changes: Optional[Mapping[str, list]] = None) -> dict[str, Any]:
    """The ``mkdirs`` op: the managed directories to make or fix, then the missing parents of the copies, then each
    copy's temporary file made empty with mode 0600 (``tmps``): the connection's transfer then writes into a file no
    group or other user can read, whatever its umask, so a secret is never readable by them, even when the run dies
    before the install step sets the final owner and mode."""
    dir_changes = dir_changes or {"make": [], "fix": []}
    return {"op": "mkdirs", "owner": owner, "group": group, "directory_mode": parse_mode(directory_mode, "directory_mode"),
            "dirs": list(dir_changes["make"]) + sorted({posixpath.dirname(c["dest"]) for c in changes["copy"]}),
            "fix": [f["dest"] for f in dir_changes["fix"]], "tmps": [c["dest"] + TMP_SUFFIX for c in changes["copy"]]}


def text_request(changes: Mapping[str, list]) -> Optional[dict[str, Any]]:
    """--diff of text given inline (content): the current text of those destinations, read in one more command
    (only in diff mode, only for files that change)."""
    paths = [c["dest"] for c in changes["copy"] if c.get("label") == "content" and c["before"].get("exists")]
    return {"op": "read_text", "paths": paths, "max_bytes": TEXT_DIFF_MAX_BYTES} if paths else None


def diff_of(changes: Mapping[str, list], dir_changes: Optional[Mapping[str, list]] = None,
            texts: Optional[Mapping[str, Optional[str]]] = None, directory_mode: str = "0755") -> list[dict[str, str]]:
    """--diff: per file that would change, its digest, mode and owner before and after (content may be binary);
    for content given inline, the text lines before (``texts``, when readable as text) and after. Directories made
    or fixed: their mode and owner."""
    def describe(state: Mapping[str, Any]) -> str:
        if not state.get("exists"):
            return "absent\n"
        mode = state.get("mode")
        shown = "%04o" % mode if isinstance(mode, int) else mode
        return "sha256 %s mode %s owner %s:%s\n" % (state.get("sha256"), shown, state.get("owner"), state.get("group"))
    out = []
    dir_changes = dir_changes or {"make": [], "fix": []}
    mode = parse_mode(directory_mode, "directory_mode")
    for d in dir_changes["make"]:
        out.append({"before_header": d, "after_header": d + " (directory)", "before": "absent\n",
                    "after": "directory mode %04o\n" % mode})
    for f in dir_changes["fix"]:
        shown = f["before"].get("mode")
        shown = "%04o" % shown if isinstance(shown, int) else shown
        before = "directory mode %s owner %s:%s\n" % (shown, f["before"].get("owner"), f["before"].get("group"))
        out.append({"before_header": f["dest"], "after_header": f["dest"] + " (directory)", "before": before,
                    "after": "directory mode %04o\n" % mode})
    texts = texts or {}
    for kind in ("copy", "fix"):
        for c in changes[kind]:
            after = describe({"exists": True, "sha256": c["sha256"], "mode": c["mode"], "owner": c["owner"], "group": c["group"]})
            before = describe(c["before"])
            if kind == "copy" and c.get("label") == "content" and c.get("text") is not None:
                old = texts.get(c["dest"]) if c["before"].get("exists") else ""
                if old is not None:
                    before, after = before + old, after + c["text"]
            out.append({"before_header": c["dest"], "after_header": "%s (%s)" % (c["dest"], c["label"]),
                        "before": before, "after": after})
    return out


def summary(changes: Mapping[str, list], dir_changes: Optional[Mapping[str, list]] = None) -> dict[str, Any]:
    dir_changes = dir_changes or {"make": [], "fix": []}
    return {"copied": [c["dest"] for c in changes["copy"]], "attributes_fixed": [c["dest"] for c in changes["fix"]]
            + [f["dest"] for f in dir_changes["fix"]], "directories_made": list(dir_changes["make"]),
            "unchanged": len(changes["same"]), "bytes_copied": sum(int(c["size"]) for c in changes["copy"])}


# The target side, run by the target's python3 with one JSON argument; stdlib only, prints one JSON object.
REMOTE_SCRIPT = r'''
import grp, hashlib, json, os, pwd, shlex, stat, subprocess, sys
req = json.loads(sys.argv[1])
def info(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"exists": False}
    out = {"exists": True, "is_file": stat.S_ISREG(st.st_mode), "is_dir": stat.S_ISDIR(st.st_mode),
           "mode": stat.S_IMODE(st.st_mode)}
    try:
        out["owner"] = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        out["owner"] = str(st.st_uid)
    try:
        out["group"] = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        out["group"] = str(st.st_gid)
    if out["is_file"]:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        out["sha256"] = h.hexdigest()
    return out
def ids(req):
    return (pwd.getpwnam(req["owner"]).pw_uid if req["owner"] is not None else -1,
            grp.getgrnam(req["group"]).gr_gid if req["group"] is not None else -1)
def run():
    if req["op"] == "read":
        print(json.dumps({p: info(p) for p in req["paths"]}))
    elif req["op"] == "mkdirs":
        uid, gid = ids(req)
        made = []
        for d in req["dirs"]:
            todo = []
            while d and not os.path.isdir(d):
                todo.append(d)
                d = os.path.dirname(d)
            for d in reversed(todo):
                try:
                    os.mkdir(d, req["directory_mode"])
                except FileExistsError:
                    # Made meanwhile by a run beside this one (two hosts' reports delegated to one controller).
                    if not os.path.isdir(d):
                        raise
                    continue
                os.chown(d, uid, gid)
                os.chmod(d, req["directory_mode"])
                made.append(d)
        for d in req.get("fix", []):
            os.chown(d, uid, gid)
            os.chmod(d, req["directory_mode"])
        for t in req.get("tmps", []):
            # A leftover of a run that died (or anything planted there) is removed, never followed; the new file is
            # made 0600 before any byte is written into it.
            if os.path.lexists(t):
                os.unlink(t)
            os.close(os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            os.chmod(t, 0o600)
        print(json.dumps({"made": made, "fixed": req.get("fix", []), "tmps": req.get("tmps", [])}))
    elif req["op"] == "read_text":
        out = {}
        for p in req["paths"]:
            try:
                with open(p, "rb") as f:
                    data = f.read(req["max_bytes"] + 1)
                out[p] = data.decode("utf-8") if len(data) <= req["max_bytes"] and b"\0" not in data else None
            except (OSError, UnicodeDecodeError):
                out[p] = None
        print(json.dumps(out))
    elif req["op"] == "install":
        done = []
        def refuse(msg):
            for it in req["items"]:
                if it["tmp"] and os.path.lexists(it["tmp"]):
                    os.unlink(it["tmp"])
            raise SystemExit(msg)
        for it in req["items"]:
            if not it["tmp"]:
                continue
            got = info(it["tmp"]).get("sha256")
            if got != it["sha256"]:
                refuse("%s arrived with sha256 %s, expected %s; nothing was changed" % (it["dest"], got, it["sha256"]))
            if it.get("validate"):
                argv = shlex.split(it["validate"].replace("%s", shlex.quote(it["tmp"])))
                try:
                    check = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
                except OSError as exc:
                    refuse("validate %r of %s could not run: %s; nothing was changed" % (it["validate"], it["dest"], exc))
                if check.returncode != 0:
                    refuse("validate %r refused the new %s (rc %d): %s; nothing was changed"
                           % (it["validate"], it["dest"], check.returncode, check.stdout.strip()[-800:]))
        for it in req["items"]:
            uid, gid = ids(it)
            path = it["tmp"] or it["dest"]
            os.chown(path, uid, gid)
            os.chmod(path, it["mode"])
            if it["tmp"]:
                os.rename(path, it["dest"])
            done.append(it["dest"])
        print(json.dumps({"installed": done}))
    else:
        raise SystemExit("unknown op %r" % req["op"])
# Whatever fails on the target (a container stopped under the run, a read-only or vanished path, a user that is not
# there) ends with one line naming it, never a traceback (the action plugin shows it to the operator).
try:
    run()
except (OSError, KeyError, ValueError, subprocess.SubprocessError) as exc:
    raise SystemExit("%s failed on the target: %s: %s" % (req.get("op"), type(exc).__name__, exc))
'''


def check_remote_answer(answer: Any, paths: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(answer, Mapping):
        raise ManagedFilesError("the target's answer is not a JSON object: %r" % (answer,))
    missing = [p for p in paths if p not in answer]
    if missing:
        raise ManagedFilesError("the target did not report %s" % ", ".join(missing[:5]))
    return answer


def mode_text(mode: Optional[int]) -> str:
    return "-" if mode is None else "%04o" % stat.S_IMODE(mode)

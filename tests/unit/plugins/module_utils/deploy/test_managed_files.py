# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""managed_files: the controller's digests, the plan, and the target-side script run for real on a temporary tree
(the files on disk are checked, not what the script printed)."""
from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import stat
import subprocess
import sys

import pytest

from ansible_collections.inferops.gpu_inference.plugins.connection import pct_remote
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import managed_files as mf

ME = pwd.getpwuid(os.getuid()).pw_name
MYGROUP = grp.getgrgid(os.getgid()).gr_name


def remote(request):
    out = subprocess.run([sys.executable, "-c", mf.REMOTE_SCRIPT, json.dumps(request)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def put(item):
    """The bytes at dest + TMP_SUFFIX, as the collection's connection (pct_remote) puts them: its own command line,
    parsed by a real shell as the node's shell parses it, then its script run by sh as in the container (what pct
    exec adds is the container; tests/lab/test_hostile_quoting.py goes through it)."""
    with open(item["src"], "rb") as handle:
        data = handle.read()
    command = pct_remote.transfer_command("/bin/sh", pct_remote.PUT_SCRIPT, item["dest"] + mf.TMP_SUFFIX)
    out = subprocess.run(["/bin/sh", "-c", command], input=data, capture_output=True, check=False)
    assert out.returncode == 0, out.stderr


def sync(rows, mode="0755"):
    """One run as the action plugin does it; returns the plan."""
    req = mf.read_request(rows)
    changes = mf.plan(rows, mf.check_remote_answer(remote(req), req["paths"]), ME, MYGROUP)
    if changes["copy"]:
        remote(mf.mkdirs_request(changes, ME, MYGROUP, mode))
    for item in changes["copy"]:
        put(item)
    if changes["copy"] or changes["fix"]:
        remote(mf.install_request(changes, ME, MYGROUP, mode))
    return changes


@pytest.fixture()
def src(tmp_path):
    top = tmp_path / "src"
    (top / "model" / "sub").mkdir(parents=True)
    (top / "model" / "config.json").write_text('{"a": 1}\n')
    (top / "model" / "sub" / "weights.bin").write_bytes(os.urandom(3000))
    (top / "launch.py").write_text("print('x')\n")
    return top


def rows_for(src, dest, launch_mode="0755"):
    return mf.expand([{"src": "launch.py", "dest": str(dest / "libexec" / "launch.py"), "mode": launch_mode}],
                     [{"src": str(src / "model") + "/", "dest": str(dest / "models" / "tiny")}],
                     lambda s: s if s.startswith("/") else str(src / s), "0644", "0755")


def test_first_run_copies_everything_then_nothing(src, tmp_path):
    dest = tmp_path / "dest"
    rows = rows_for(src, dest)
    assert [r["dest"] for r in rows] == sorted(r["dest"] for r in rows) and len(rows) == 3
    first = sync(rows)
    assert len(first["copy"]) == 3 and not first["fix"]
    # The world: the bytes, the modes, no temporary file left.
    for r in rows:
        with open(r["dest"], "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == r["sha256"]
        assert stat.S_IMODE(os.stat(r["dest"]).st_mode) == r["mode"]
        assert not os.path.exists(r["dest"] + mf.TMP_SUFFIX)
    assert stat.S_IMODE(os.stat(dest / "models" / "tiny" / "sub").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dest / "libexec" / "launch.py").st_mode) == 0o755
    second = sync(rows_for(src, dest))
    assert not second["copy"] and not second["fix"] and len(second["same"]) == 3


def test_only_what_differs_is_copied_and_a_mode_alone_is_fixed(src, tmp_path):
    dest = tmp_path / "dest"
    sync(rows_for(src, dest))
    (src / "model" / "config.json").write_text('{"a": 2}\n')
    os.chmod(dest / "libexec" / "launch.py", 0o600)
    changes = sync(rows_for(src, dest))
    assert [c["dest"] for c in changes["copy"]] == [str(dest / "models" / "tiny" / "config.json")]
    assert [c["dest"] for c in changes["fix"]] == [str(dest / "libexec" / "launch.py")]
    assert (dest / "models" / "tiny" / "config.json").read_text() == '{"a": 2}\n'
    assert stat.S_IMODE(os.stat(dest / "libexec" / "launch.py").st_mode) == 0o755
    diff = mf.diff_of(changes)
    assert diff[0]["before"].startswith("sha256 ") and diff[0]["before"] != diff[0]["after"]
    assert mf.summary(changes)["bytes_copied"] == len('{"a": 2}\n')


def test_a_copy_that_arrives_damaged_is_refused_and_removed(src, tmp_path):
    dest = tmp_path / "dest"
    rows = rows_for(src, dest)
    req = mf.read_request(rows)
    changes = mf.plan(rows, remote(req), ME, MYGROUP)
    remote(mf.mkdirs_request(changes, ME, MYGROUP, "0755"))
    for item in changes["copy"]:
        with open(item["dest"] + mf.TMP_SUFFIX, "w") as f:
            f.write("truncated")
    out = subprocess.run([sys.executable, "-c", mf.REMOTE_SCRIPT, json.dumps(mf.install_request(changes, ME, MYGROUP, "0755"))],
                         capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "expected" in out.stderr
    assert not any(os.path.exists(c["dest"]) for c in changes["copy"])


def test_a_destination_that_is_a_directory_is_refused(src, tmp_path):
    dest = tmp_path / "dest"
    (dest / "libexec" / "launch.py").mkdir(parents=True)
    rows = rows_for(src, dest)
    with pytest.raises(mf.ManagedFilesError, match="not a regular file"):
        mf.plan(rows, remote(mf.read_request(rows)), ME, MYGROUP)


@pytest.mark.parametrize("files,trees,msg", [
    ([{"src": "launch.py"}], [], "with src and dest"),
    ([{"src": "launch.py", "dest": "relative/x"}], [], "absolute path"),
    ([{"src": "launch.py", "dest": "/a/../b"}], [], "normalised"),
    ([{"src": "launch.py", "dest": "/a/b", "mode": 644}], [], "octal mode"),
    ([{"src": "launch.py", "dest": "/a/b", "mode": "0999"}], [], "octal mode"),
    ([{"src": "missing.py", "dest": "/a/b"}], [], "not a regular file"),
    ([], [{"src": "launch.py", "dest": "/a"}], "not a directory"),
    ([{"src": "launch.py", "dest": "/a/b"}, {"src": "model/config.json", "dest": "/a/b"}], [], "destination of both"),
])
def test_bad_arguments_are_refused_before_any_change(src, files, trees, msg):
    with pytest.raises(mf.ManagedFilesError, match=msg):
        mf.expand(files, trees, lambda s: str(src / s), "0644", "0755")


def test_a_dest_ending_in_a_slash_is_a_directory(src):
    rows = mf.expand([{"src": "launch.py", "dest": "/opt/wheels/"}], [], lambda s: str(src / s), "0644", "0755")
    assert rows[0]["dest"] == "/opt/wheels/launch.py" and rows[0]["mode"] == 0o644


def test_a_file_may_have_its_own_owner_group_and_mode(src, tmp_path):
    dest = tmp_path / "dest"
    rows = mf.expand([{"src": "launch.py", "dest": str(dest / "key"), "mode": "0640", "group": MYGROUP, "owner": ME}],
                     [], lambda s: str(src / s), "0644", "0755")
    changes = sync(rows)
    assert changes["copy"][0]["group"] == MYGROUP and stat.S_IMODE(os.stat(dest / "key").st_mode) == 0o640
    with pytest.raises(mf.ManagedFilesError, match="user or group name"):
        mf.expand([{"src": "launch.py", "dest": "/k", "group": "a:b"}], [], lambda s: str(src / s), "0644", "0755")


def test_directories_are_made_then_their_mode_fixed_in_the_same_read(tmp_path):
    top = tmp_path / "opt" / "sglang"
    dirs = mf.directories([str(top / "wheelhouse"), str(top)])
    req = mf.read_request([], dirs)
    first = mf.plan_dirs(dirs, remote(req), ME, MYGROUP, "0750")
    assert first["make"] == [str(top), str(top / "wheelhouse")] and not first["fix"]
    remote(mf.mkdirs_request({"copy": []}, ME, MYGROUP, "0750", first))
    assert all(stat.S_IMODE(os.stat(d).st_mode) == 0o750 for d in dirs)  # the world, not the plan
    os.chmod(top, 0o700)
    second = mf.plan_dirs(dirs, remote(req), ME, MYGROUP, "0750")
    assert not second["make"] and [f["dest"] for f in second["fix"]] == [str(top)]
    assert "directory mode 0700" in mf.diff_of({"copy": [], "fix": []}, second, directory_mode="0750")[0]["before"]
    remote(mf.mkdirs_request({"copy": []}, ME, MYGROUP, "0750", second))
    assert stat.S_IMODE(os.stat(top).st_mode) == 0o750
    assert mf.plan_dirs(dirs, remote(req), ME, MYGROUP, "0750") == {"make": [], "fix": []}
    (tmp_path / "afile").write_text("x")
    with pytest.raises(mf.ManagedFilesError, match="not a directory"):
        mf.plan_dirs([str(tmp_path / "afile")], remote(mf.read_request([], [str(tmp_path / "afile")])), ME, MYGROUP, "0755")
    with pytest.raises(mf.ManagedFilesError, match="absolute path"):
        mf.directories(["relative"])


def _unit_rows(src, dest, text, validate):
    (src / "unit").write_text(text)
    return mf.expand([{"src": "unit", "dest": str(dest / "a.service"), "validate": validate, "text": text, "label": "content"},
                      {"src": "launch.py", "dest": str(dest / "launch.py")}],
                     [], lambda s: str(src / s), "0644", "0755")


def test_validate_refuses_the_new_file_and_nothing_changes(src, tmp_path):
    dest = tmp_path / "dest"
    script = tmp_path / "check.py"
    script.write_text("import sys\nsys.exit(0 if open(sys.argv[1]).read().startswith('[Unit]') else 3)\n")
    validate = "%s %s %%s" % (sys.executable, script)
    sync(_unit_rows(src, dest, "[Unit]\nDescription=a\n", validate))
    assert (dest / "a.service").read_text() == "[Unit]\nDescription=a\n"
    (src / "launch.py").write_text("print('y')\n")
    rows = _unit_rows(src, dest, "garbage\n", validate)
    req = mf.read_request(rows)
    changes = mf.plan(rows, remote(req), ME, MYGROUP)
    assert len(changes["copy"]) == 2
    for item in changes["copy"]:
        put(item)
    out = subprocess.run([sys.executable, "-c", mf.REMOTE_SCRIPT, json.dumps(mf.install_request(changes, ME, MYGROUP, "0755"))],
                         capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "refused the new" in out.stderr and "nothing was changed" in out.stderr
    # Neither file was replaced (the valid launcher waits for the unit), and no temporary file is left.
    assert (dest / "a.service").read_text() == "[Unit]\nDescription=a\n"
    assert (dest / "launch.py").read_text() == "print('x')\n"
    assert not [p for p in os.listdir(dest) if p.endswith(mf.TMP_SUFFIX)]
    with pytest.raises(mf.ManagedFilesError, match="containing %s"):
        mf.expand([{"src": "launch.py", "dest": "/a", "validate": "true"}], [], lambda s: str(src / s), "0644", "0755")


def test_diff_of_inline_content_shows_its_text_before_and_after(src, tmp_path):
    dest = tmp_path / "dest"
    sync(_unit_rows(src, dest, "[Unit]\nDescription=a\n", None))
    rows = _unit_rows(src, dest, "[Unit]\nDescription=b\n", None)
    changes = mf.plan(rows, remote(mf.read_request(rows)), ME, MYGROUP)
    texts = remote(mf.text_request(changes))
    assert texts == {str(dest / "a.service"): "[Unit]\nDescription=a\n"}
    diff = mf.diff_of(changes, texts=texts)
    assert diff[0]["before"].endswith("Description=a\n") and diff[0]["after"].endswith("Description=b\n")


def test_an_owner_of_none_is_left_as_made(src, tmp_path):
    dest = tmp_path / "report"
    rows = mf.expand([{"src": "launch.py", "dest": str(dest / "deploy.txt")}], [], lambda s: str(src / s), "0644", "0755")
    req = mf.read_request(rows, [str(dest)])
    remote_state = remote(req)
    dirs = mf.plan_dirs([str(dest)], remote_state, None, None, "0755")
    changes = mf.plan(rows, remote_state, None, None)
    remote(mf.mkdirs_request(changes, None, None, "0755", dirs))
    for item in changes["copy"]:
        put(item)
    remote(mf.install_request(changes, None, None, "0755"))
    assert os.stat(dest / "deploy.txt").st_uid == os.getuid() and (dest / "deploy.txt").read_text() == "print('x')\n"
    again = mf.plan(rows, remote(req), None, None)
    assert not again["copy"] and not again["fix"]


def test_a_parent_made_by_another_run_meanwhile_is_no_failure(tmp_path):
    # Two containers' reports are written on one controller at once (deploy's verify, delegated to localhost): both
    # runs make the same missing parents, and one found "reports" made between its check and its mkdir
    # (FileExistsError: the CI preview's converge failed). Played exactly: the check is told "missing" once for a
    # directory another run has just made.
    (tmp_path / "reports").mkdir()
    req = {"op": "mkdirs", "owner": None, "group": None, "directory_mode": 0o755,
           "dirs": [str(tmp_path / "reports" / "ct129")]}
    race = ("import os, sys\n_isdir, _lied = os.path.isdir, []\n"
            "def isdir(p):\n"
            "    if p == %r and not _lied:\n"
            "        _lied.append(p)\n"
            "        return False\n"
            "    return _isdir(p)\n"
            "os.path.isdir = isdir\n" % str(tmp_path / "reports"))
    out = subprocess.run([sys.executable, "-c", race + mf.REMOTE_SCRIPT, json.dumps(req)], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["made"] == [str(tmp_path / "reports" / "ct129")]
    assert (tmp_path / "reports" / "ct129").is_dir()


def test_a_failure_on_the_target_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o500)
    req = {"op": "mkdirs", "owner": None, "group": None, "directory_mode": 0o755, "dirs": [str(tmp_path / "ro" / "x")]}
    out = subprocess.run([sys.executable, "-c", mf.REMOTE_SCRIPT, json.dumps(req)], capture_output=True, text=True, check=False)
    if os.geteuid() == 0:  # root ignores the mode: a path under a regular file fails the same way for root
        (tmp_path / "file").write_text("x")
        req["dirs"] = [str(tmp_path / "file" / "x")]
        out = subprocess.run([sys.executable, "-c", mf.REMOTE_SCRIPT, json.dumps(req)], capture_output=True, text=True, check=False)
    assert out.returncode == 1 and "mkdirs failed on the target" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


# --- hostile names and secrets -----------------------------------------------------------------------------------

HOSTILE = ["$(touch pwned-dollar)", "`touch pwned-backquote`", "a b  c", "it's \"quoted\"", "-rf", "x;touch pwned-semi",
           "*", "$HOME"]


def test_hostile_names_land_with_exactly_their_name_and_nothing_runs(src, tmp_path, monkeypatch):
    """A name under a model directory or a wheelhouse is a path the transfer quotes: each lands as named."""
    for i, name in enumerate(HOSTILE):
        (src / "model" / name).write_text("file %d\n" % i)
    dest = tmp_path / "dest"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # where an injected `touch pwned-...` would write
    sync(rows_for(src, dest))
    landed = sorted(os.listdir(dest / "models" / "tiny"))
    assert landed == sorted(HOSTILE + ["config.json", "sub"])
    for i, name in enumerate(HOSTILE):
        assert (dest / "models" / "tiny" / name).read_text() == "file %d\n" % i
    assert os.listdir(cwd) == [] and not [p for p in os.listdir(tmp_path) if p.startswith("pwned")]


@pytest.mark.parametrize("bad", ["/etc/a\nb", "/etc/a\rb", "/etc/a\tb", "/etc/a\x1bb", "/etc/a\x7fb", "/etc/a\u2028b"])
def test_a_destination_with_a_control_character_is_refused(src, bad):
    with pytest.raises(mf.ManagedFilesError, match="control character .*rename the file"):
        mf.expand([{"src": "launch.py", "dest": bad}], [], lambda s: str(src / s), "0644", "0755")
    with pytest.raises(mf.ManagedFilesError, match="control character"):
        mf.directories([bad])


def test_a_tree_file_named_with_a_newline_is_refused_before_any_change(src, tmp_path):
    (src / "model" / "evil\n$(touch pwned)").write_text("x")
    dest = tmp_path / "dest"
    with pytest.raises(mf.ManagedFilesError, match=r"trees\[0\]: the file '[^\n]*evil\\n.*control character \\n: "):
        rows_for(src, dest)
    assert not dest.exists()


@pytest.mark.parametrize("name", ["-x", "a\nb", "a:b", "a/b", "a b"])
def test_an_owner_or_group_like_an_option_or_with_a_separator_is_refused(src, name):
    for key in ("owner", "group"):
        with pytest.raises(mf.ManagedFilesError, match="user or group name"):
            mf.expand([{"src": "launch.py", "dest": "/k", key: name}], [], lambda s: str(src / s), "0644", "0755")


def test_a_secret_is_written_into_a_file_made_0600_before_its_first_byte(src, tmp_path):
    """Whatever the umask, the temporary file the transfer writes into exists with mode 0600 before any byte; a run
    killed between the transfer and the install leaves it 0600; the install gives the final mode."""
    dest = tmp_path / "etc"
    (src / "key").write_text("SECRET\n")
    rows = mf.expand([{"src": "key", "dest": str(dest / "api-key"), "mode": "0640", "group": MYGROUP}],
                     [], lambda s: str(src / s), "0644", "0755")
    changes = mf.plan(rows, remote(mf.read_request(rows)), ME, MYGROUP)
    old = os.umask(0)  # the most permissive session: a mode from the umask would show here
    try:
        remote(mf.mkdirs_request(changes, ME, MYGROUP, "0755"))
        tmp = dest / ("api-key" + mf.TMP_SUFFIX)
        st = os.lstat(tmp)
        assert stat.S_ISREG(st.st_mode) and st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o600
        put(changes["copy"][0])
        assert tmp.read_text() == "SECRET\n" and stat.S_IMODE(os.lstat(tmp).st_mode) == 0o600
        remote(mf.install_request(changes, ME, MYGROUP, "0755"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(dest / "api-key").st_mode) == 0o640 and not tmp.exists()


def test_the_transfer_alone_creates_a_new_file_0600_under_a_0022_umask(tmp_path):
    """Without the prepared file (any other caller of put_file), the connection's own umask 077 applies."""
    (tmp_path / "src").write_text("SECRET\n")
    old = os.umask(0o022)
    try:
        put({"src": str(tmp_path / "src"), "dest": str(tmp_path / "new")})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / ("new" + mf.TMP_SUFFIX)).st_mode) == 0o600


def test_a_symlink_planted_at_the_temporary_name_is_removed_not_followed(src, tmp_path):
    dest = tmp_path / "etc"
    dest.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    os.chmod(victim, 0o644)
    os.symlink(victim, dest / ("api-key" + mf.TMP_SUFFIX))
    (src / "key").write_text("SECRET\n")
    rows = mf.expand([{"src": "key", "dest": str(dest / "api-key"), "mode": "0600"}], [], lambda s: str(src / s), "0644", "0755")
    sync(rows)
    assert victim.read_text() == "untouched\n" and stat.S_IMODE(os.stat(victim).st_mode) == 0o644
    assert (dest / "api-key").read_text() == "SECRET\n" and not os.path.islink(dest / "api-key")

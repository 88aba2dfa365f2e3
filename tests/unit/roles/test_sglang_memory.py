"""The memory tool (roles/sglang_server/files/sglang_memory.py) as the deploy runs it in the container: `verify` waits
for /health, reads /server_info with the key from the key file and never prints the key; `preflight` reads the
virtualenv's installed sglang and the service user. Run as a real process against a real HTTP server."""

from __future__ import annotations

import http.server
import json
import os
import pwd
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "..", "roles", "sglang_server", "files", "sglang_memory.py")
KEY = "s3cret-key"


def run(*args, check=True):
    out = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=60, check=False)
    if check:
        assert out.returncode == 0, out.stderr
    return out


@pytest.fixture()
def server():
    """/health 503 for the first second, then 200; /server_info 401 without the Bearer key, else the arguments with
    the key echoed back (as SGLang's /server_info does)."""
    started = time.monotonic()
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path == "/health":
                code, body = (200, b"") if time.monotonic() - started > 1.0 else (503, b"")
            elif self.path == "/server_info":
                if self.headers.get("Authorization") != "Bearer " + KEY:
                    code, body = 401, b"{}"
                else:
                    code, body = 200, json.dumps({"tp_size": 2, "hicache_size": 4, "api_key": KEY, "admin_api_key": KEY}).encode()
            else:
                code, body = 404, b""
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % httpd.server_address[1], seen
    httpd.shutdown()


def test_verify_waits_for_health_and_reads_server_info_without_printing_the_key(server, tmp_path):
    url, seen = server
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    out = run("verify", "--unit", "no-such.service", "--health-url", url, "--info-path", "server_info",
              "--api-key-file", str(key_file), "--timeout", "20")
    assert KEY not in out.stdout and KEY not in out.stderr
    got = json.loads(out.stdout)
    assert got["server_info"] == {"tp_size": 2, "hicache_size": 4} and got["health_waited_s"] >= 1.0
    assert "meminfo" in got and got["processes"] == []
    # What the server saw: /health polled until 200, then /server_info with the Bearer key; /health without it.
    assert [p for p, _a in seen].count("/health") >= 2 and seen[-1] == ("/server_info", "Bearer " + KEY)
    assert all(a is None for p, a in seen if p == "/health")


def test_verify_gives_up_after_its_timeout_saying_what_it_saw(server):
    url, _seen = server
    out = run("verify", "--health-url", url + "/nowhere", "--timeout", "2", check=False)
    assert out.returncode != 0 and "did not answer 200 within 2 s" in out.stderr and "HTTP 404" in out.stderr


def test_preflight_reads_the_installed_sglang_and_the_user(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "sglang-0.5.21.dist-info").mkdir(parents=True)
    (site / "sglang-0.5.21.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.21\n\nbody\n")
    (site / "other-1.0.dist-info").mkdir()
    (site / "other-1.0.dist-info" / "METADATA").write_text("Name: other\nVersion: 1.0\n")
    me = pwd.getpwuid(os.getuid())
    assert os.path.isdir(me.pw_dir), "the test's premise: the user running it has its home directory"
    user = ("--user", me.pw_name, "--user-home", me.pw_dir, "--user-shell")
    out = json.loads(run("preflight", "--model-config", str(tmp_path / "absent" / "config.json"), "--venv",
                         str(tmp_path / "venv"), *user, me.pw_shell).stdout)
    assert out["sglang_installed_version"] == "0.5.21" and out["venv_pip_present"] is False
    assert out["model_config_present"] is False
    assert out["user_as_wanted"] is True
    other_shell = "/bin/false" if me.pw_shell != "/bin/false" else "/usr/sbin/nologin"
    out = json.loads(run("preflight", "--model-config", "/x", *user, other_shell).stdout)
    assert out["user_as_wanted"] is False
    out = json.loads(run("preflight", "--model-config", "/x", "--user", me.pw_name, "--user-home", str(tmp_path / "nohome"),
                         "--user-shell", me.pw_shell).stdout)
    assert out["user_as_wanted"] is False
    (tmp_path / "venv" / "bin").mkdir()
    (tmp_path / "venv" / "bin" / "pip").write_text("")
    out = json.loads(run("preflight", "--model-config", "/x", "--venv", str(tmp_path / "venv"), "--user",
                         "no-such-user-here", "--user-home", "/nonexistent", "--user-shell", "/usr/sbin/nologin").stdout)
    assert out["venv_pip_present"] is True and out["user_as_wanted"] is False
    empty = json.loads(run("preflight", "--model-config", "/x", "--venv", str(tmp_path / "none")).stdout)
    assert empty["sglang_installed_version"] is None

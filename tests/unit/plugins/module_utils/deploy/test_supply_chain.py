# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/deploy/supply_chain.py: the NVIDIA installer runs only with the inventory's sha256; pip sources and hashes."""
from __future__ import annotations

import hashlib

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import supply_chain as sc

SHA = hashlib.sha256(b"installer").hexdigest()
OTHER = hashlib.sha256(b"impostor").hexdigest()


def test_installer_needed_requires_the_inventorys_sha256():
    with pytest.raises(sc.SupplyError, match="gives no sha256") as e:
        sc.plan({}, "0.5.21", "580.82.07", "", [])
    assert "NVIDIA-Linux-x86_64-580.82.07.run" in str(e.value) and "Nothing was changed" in str(e.value)
    with pytest.raises(sc.SupplyError, match="gives no sha256"):
        sc.plan({"installer_sha256": {"580.95.05": SHA}}, "0.5.21", "580.82.07", "580.95.05", [])
    got = sc.plan({"installer_sha256": {"580.82.07": "SHA256:" + SHA.upper()}}, "0.5.21", "580.82.07", "", [])
    assert got["installer"] == {"needed": True, "file": "NVIDIA-Linux-x86_64-580.82.07.run", "sha256": SHA, "source": "node"}


def test_installer_source_is_the_url_when_given_else_the_node():
    sha = {"580.82.07": SHA}
    assert sc.plan({"installer_sha256": sha, "installer_url": "https://mirror/nvidia/"}, "0.5.21", "580.82.07", "535.1", [])[
        "installer"]["source"] == "url"
    assert sc.plan({"installer_sha256": sha, "installer_url": "  "}, "0.5.21", "580.82.07", "535.1", [])[
        "installer"]["source"] == "node"
    # Not needed: no source, whatever the URL.
    assert sc.plan({"installer_url": "https://mirror/"}, "0.5.21", "580.82.07", "580.82.07", [])["installer"]["source"] == ""


def test_driver_after_the_install_must_be_the_nodes():
    assert sc.check_driver_installed("580.82.07", "580.82.07\n580.82.07\n") == "580.82.07"
    assert sc.check_driver_installed("580.82.07", "  580.82.07  ") == "580.82.07"
    for seen in ("535.104.05\n", "", None, "580.82.07x"):
        with pytest.raises(sc.SupplyError, match="not the node's 580.82.07"):
            sc.check_driver_installed("580.82.07", seen)


def test_installer_not_needed_needs_no_sha256():
    assert sc.plan({}, "0.5.21", "580.82.07", "580.82.07", [])["installer"]["needed"] is False


@pytest.mark.parametrize("bad", [{"580.82.07": "abc"}, {"580.82.07": SHA + "0"}, ["580.82.07", SHA], "x"])
def test_malformed_sha256_is_refused(bad):
    with pytest.raises(sc.SupplyError):
        sc.plan({"installer_sha256": bad}, "0.5.21", "580.82.07", "", [])


def test_driver_version_is_not_a_path():
    with pytest.raises(sc.SupplyError, match="not a version"):
        sc.plan({"installer_sha256": {"../x": SHA}}, "0.5.21", "../x", "", [])


def test_installer_checked_before_it_runs():
    sc.check_installer(SHA, SHA.upper(), "/root/x.run")
    for actual in (OTHER, "", None):
        with pytest.raises(sc.SupplyError, match="it was not run"):
            sc.check_installer(SHA, actual, "/root/x.run")


@pytest.mark.parametrize("field", ["pip_index_url", "pip_find_links"])
def test_plain_http_pip_sources_refused_unless_allowed(field):
    with pytest.raises(sc.SupplyError, match="plain HTTP"):
        sc.plan({field: "HTTP://mirror.example/simple"}, "0.5.21", "1.2", "1.2", [])
    sc.plan({field: "http://mirror.example/simple", "pip_allow_http": True}, "0.5.21", "1.2", "1.2", [])
    sc.plan({field: "https://mirror.example/simple"}, "0.5.21", "1.2", "1.2", [])
    sc.plan({field: "/opt/wheels"}, "0.5.21", "1.2", "1.2", [])


def test_hashes_make_a_require_hashes_file_of_the_wanted_sglang_and_the_rest():
    hashes = {"sglang==0.5.21": [SHA], "sglang==0.5.23": [OTHER], "setproctitle==1.3.8": ["sha256:" + OTHER, SHA]}
    text = sc.plan({"pip_hashes": hashes}, "0.5.21", "1.2", "1.2", [])["pip"]["requirements"]
    assert text.splitlines() == ["setproctitle==1.3.8 --hash=sha256:%s --hash=sha256:%s" % (OTHER, SHA),
                                 "sglang==0.5.21 --hash=sha256:%s" % SHA]
    assert sc.plan({}, "0.5.21", "1.2", "1.2", [])["pip"]["requirements"] == ""


@pytest.mark.parametrize("hashes,extra,says", [
    ({"sglang==0.5.20": [SHA]}, [], "no entry 'sglang==0.5.21'"),
    ({"sglang>=0.5": [SHA]}, [], "exact pin"),
    ({"sglang==0.5.21": []}, [], "must list"),
    ({"sglang==0.5.21": ["md5:abc"]}, [], "not a sha256"),
    ({"sglang==0.5.21": [SHA]}, ["orjson"], "does not pin"),
    (["sglang==0.5.21"], [], "must map"),
])
def test_bad_hashes_are_refused(hashes, extra, says):
    with pytest.raises(sc.SupplyError, match=says):
        sc.plan({"pip_hashes": hashes}, "0.5.21", "1.2", "1.2", extra)

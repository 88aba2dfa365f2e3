# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pve_options: PVE property strings, normalisation and the comparison of one option."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_options as po
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import ConfigError


# ---- property strings -----------------------------------------------------------------------


def test_parse_property_string_default_key():
    assert po.parse_property_string("local-lvm:vm-129-disk-0,size=8G", "volume") == {
        "volume": "local-lvm:vm-129-disk-0",
        "size": "8G",
    }
    assert po.parse_property_string("/dev/nvidia0,gid=44", "path") == {"path": "/dev/nvidia0", "gid": "44"}
    assert po.parse_property_string("path=/dev/nvidia0", "path") == {"path": "/dev/nvidia0"}
    assert po.parse_property_string("") == {}


def test_parse_property_string_errors():
    with pytest.raises(ConfigError, match="not key=value"):
        po.parse_property_string("name=eth0,bridge")
    with pytest.raises(ConfigError, match="appears twice"):
        po.parse_property_string("name=eth0,name=eth1")


def test_format_roundtrip():
    props = {"path": "/dev/nvidia0", "gid": "44"}
    assert po.format_property_string(props, "path") == "/dev/nvidia0,gid=44"


def test_parse_size_bytes():
    assert po.parse_size_bytes("8G") == 8 * 1024**3
    assert po.parse_size_bytes("512M") == 512 * 1024**2
    assert po.parse_size_bytes("1024") == 1024
    assert po.parse_size_bytes("0.5T") == 512 * 1024**3
    with pytest.raises(ConfigError, match="disk size"):
        po.parse_size_bytes("eight")


# ---- option comparison ----------------------------------------------------------------------


def test_compare_key_order_and_booleans():
    assert po.compare_option("features", "nesting=1,keyctl=1", "keyctl=true,nesting=yes").equal
    assert po.compare_option("features", "nesting=1", "nesting=1,keyctl=0").equal  # default dropped
    assert not po.compare_option("features", "nesting=1", "nesting=1,keyctl=1").equal


def test_compare_net_keeps_pve_filled_keys():
    current = "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:2A:3B:4C,ip=dhcp,type=veth"  # as PVE stores it
    cmp = po.compare_option("net0", current, "name=eth0,bridge=vmbr0,ip=dhcp")
    assert cmp.equal
    cmp = po.compare_option("net0", current, "name=eth0,bridge=vmbr1,ip=dhcp")
    assert not cmp.equal
    # The MAC address PVE generated is kept when the new value does not name one.
    assert po.parse_property_string(cmp.put_value)["hwaddr"] == "BC:24:11:2A:3B:4C"
    assert po.compare_option("net0", current, "name=eth0,bridge=vmbr0,ip=dhcp,hwaddr=bc:24:11:2a:3b:4c").equal


def test_compare_rootfs_allocation_form():
    current = "local-lvm:vm-129-disk-0,size=200G"
    assert po.compare_option("rootfs", current, "local-lvm:200").equal
    assert po.compare_option("rootfs", current, "local-lvm:vm-129-disk-0").equal  # size filled by PVE
    assert po.compare_option("rootfs", current, "local-lvm:vm-129-disk-0,size=204800M").equal
    cmp = po.compare_option("rootfs", current, "local-lvm:200,mountoptions=noatime")
    assert not cmp.equal
    # Never send the allocation form for an existing volume: that would allocate a new disk.
    assert cmp.put_value == "local-lvm:vm-129-disk-0,mountoptions=noatime,size=200G"


def test_compare_rootfs_refuses_resize_and_move():
    current = "local-lvm:vm-129-disk-0,size=200G"
    with pytest.raises(ConfigError, match="does not resize"):
        po.compare_option("rootfs", current, "local-lvm:300")
    with pytest.raises(ConfigError, match="does not move"):
        po.compare_option("rootfs", current, "zfs:200")
    with pytest.raises(ConfigError, match="does not swap or move"):
        po.compare_option("rootfs", current, "local-lvm:vm-129-disk-1")


def test_compare_scalars():
    assert po.compare_option("memory", 65536, "65536").equal
    assert po.compare_option("onboot", 1, "true").equal
    assert not po.compare_option("cores", 8, "16").equal
    assert po.compare_option("cpulimit", 2.0, "2").equal


def test_option_base_and_index():
    assert po.option_base("dev12") == "dev" and po.option_index("dev12") == 12
    assert po.option_base("rootfs") == "rootfs" and po.option_index("rootfs") is None


def test_split_tags():
    assert po.split_tags("inferops-gpu;team-a, b c") == ["inferops-gpu", "team-a", "b", "c"]
    assert po.split_tags(None) == [] and po.split_tags("") == []


def test_compare_keeps_pve9_keys_the_declaration_leaves_out():
    """net[n] host-managed, mp[n] keepattrs and idmap (PVE 9): an operator's value stays when the declaration does
    not name the key; named, it is compared and sent."""
    cur = "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=10.0.0.2/24,host-managed=1,type=veth"
    cmp = po.compare_option("net0", cur, "name=eth0,bridge=vmbr0,ip=10.0.0.2/24")
    assert cmp.equal
    cmp = po.compare_option("net0", cur, "name=eth0,bridge=vmbr0,ip=10.0.0.3/24")
    assert not cmp.equal
    assert po.parse_property_string(cmp.put_value)["host-managed"] == "1"
    cmp = po.compare_option("net0", cur, "name=eth0,bridge=vmbr0,ip=10.0.0.2/24,host-managed=0")
    assert not cmp.equal and "host-managed=0" in cmp.put_value
    assert po.compare_option("net0", cur, "name=eth0,bridge=vmbr0,ip=10.0.0.2/24,host-managed=yes").equal

    mp = "/srv/models,mp=/models,keepattrs=1,idmap=u:0:1000:1;g:0:1000:1,ro=1"
    cmp = po.compare_option("mp0", mp, "/srv/models,mp=/models,ro=1")
    assert cmp.equal
    cmp = po.compare_option("mp0", mp, "/srv/models,mp=/models")
    assert not cmp.equal
    put = po.parse_property_string(cmp.put_value, "volume")
    assert put["keepattrs"] == "1" and put["idmap"] == "u:0:1000:1;g:0:1000:1" and "ro" not in put
    cmp = po.compare_option("mp0", mp, "/srv/models,mp=/models,ro=1,idmap=passthrough")
    assert not cmp.equal and "idmap=passthrough" in cmp.put_value
    # keepattrs=0 is the default: declared 0 equals absent
    assert po.compare_option("mp0", "/srv/models,mp=/models", "/srv/models,mp=/models,keepattrs=0").equal

"""Shared helpers of the AWX tests: the repository root, YAML loading, and the collection's link (pytest.ini puts
.collections and the harness, runner/, on the path)."""

from __future__ import annotations

import importlib
import os

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
AWX = os.path.join(ROOT, "awx")
COLLECTIONS = os.path.join(ROOT, ".collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "inferops", "gpu_inference")

if not os.path.exists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink("../../..", LINK)
    importlib.invalidate_caches()  # .collections did not exist when pytest put it on the path


def load(path: str):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return yaml.safe_load(f)


def awx_config():
    return load("awx/config.yml")

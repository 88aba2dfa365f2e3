"""Make `ansible_collections.inferops.gpu_inference` importable from a plain checkout."""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COLLECTIONS = os.path.join(ROOT, ".collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "inferops", "gpu_inference")

# Under ansible-test the checkout already sits at .../ansible_collections/inferops/gpu_inference.
if os.path.basename(os.path.dirname(os.path.dirname(ROOT))) != "ansible_collections":
    if not os.path.exists(LINK):
        os.makedirs(os.path.dirname(LINK), exist_ok=True)
        os.symlink("../../..", LINK)
    if COLLECTIONS not in sys.path:
        sys.path.insert(0, COLLECTIONS)

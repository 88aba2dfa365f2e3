"""The simulated Proxmox VE node: its backend (pvelab), REST API (api), pct, schema checks, node namespaces, template.

Imported from the lab's root, tests/lab (docs/lab.md, "The lab's code").
"""

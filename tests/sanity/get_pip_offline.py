"""Stand-in for ansible-test's pip bootstrap script (get-pip.py).

ansible-test downloads get-pip.py from a host this project's machines cannot reach. Its job is to put
pip into a fresh virtualenv and install the pinned infrastructure packages; Python's own ensurepip
plus PyPI do the same. `make sanity` copies this file to ~/.ansible/test/cache/get_pip_<ver>.py.
"""
import subprocess
import sys

subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"] + args)

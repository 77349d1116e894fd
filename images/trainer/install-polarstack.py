"""Install the polarstack package into the trainer image with its dependencies, on any base.

Each runtime dependency pyproject.toml pins is installed at that pin only where the base has no distribution of
that name: slime's image keeps the httpx/pydantic/fastapi versions slime and SGLang were built with, and a bare
base (DEVICE=cpu's trainer base) gets every one at the pin. Then the package itself, editable, without touching
them. Prints what it kept and what it installed.
Usage: python3 install-polarstack.py /opt/polarstack --dependencies | --package
"""

import importlib.metadata
import re
import subprocess
import sys
import tomllib

root, step = sys.argv[1], sys.argv[2]
pip = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
if step == "--package":
    subprocess.run([*pip, "--no-deps", "-e", root], check=True)
    sys.exit(0)
with open(f"{root}/pyproject.toml", "rb") as handle:
    requirements = tomllib.load(handle)["project"]["dependencies"]
missing = []
for requirement in requirements:
    name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]
    try:
        print(
            f"install-polarstack: {name} {importlib.metadata.version(name)} kept from the base ({requirement} pinned)"
        )
    except importlib.metadata.PackageNotFoundError:
        missing.append(requirement)
if missing:
    print(f"install-polarstack: installing {' '.join(missing)}")
    subprocess.run([*pip, *missing], check=True)

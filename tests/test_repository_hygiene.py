"""The repository names no package-registry or mirror host: machines bring their own."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Spelled in pieces so this file does not name them either.
HOSTS = ["deb." + "debian.org", "pypi" + ".org", "files." + "pythonhosted", "registry-1" + ".docker",
         "archive." + "ubuntu.com", "security." + "debian.org", "ghcr" + ".io", "quay" + ".io"]


def test_no_tracked_file_names_a_registry_or_mirror_host() -> None:
    """Every tracked file is free of registry and mirror host names."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    found = []
    for name in files:
        path = REPO / name
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", "replace").lower()
        found += [f"{name}: {host}" for host in HOSTS if host in text]
    assert not found, "\n".join(found)


def test_the_base_image_script_takes_its_mirror_from_apt_or_an_argument() -> None:
    """make-base-image.sh reads the apt sources (or --mirror) instead of naming a mirror."""
    script = (REPO / "docker" / "make-base-image.sh").read_text()
    assert "/etc/apt/sources.list" in script and "--mirror" in script
    out = subprocess.run(["bash", str(REPO / "docker" / "make-base-image.sh"), "--mirror"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--mirror needs a URL" in out.stderr

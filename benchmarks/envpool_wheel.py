"""Build an Atari-only envpool wheel, and the wheels it imports, for the lent GPU machine (``make gpu-wheels``).

The GPU check measures envpool's Atari (Pong-v5) there, but that machine has no package index and a call to it
carries at most 64 MiB. The envpool 1.2.5 wheel is 52 MB (MuJoCo, VizDoom, Procgen, ... beside Atari) and its
Requires-Dist pulls envpool-assets (62 MB of every family's assets) and more. This script downloads both into a
temporary folder and writes into ``--out``:

* envpool repacked with only its Python layer, Atari's extension and the Atari ROMs (taken from envpool-assets into
  ``envpool/atari/roms``, where envpool looks first); ``envpool/entry.py`` registers Atari alone, so ``import envpool``
  neither loads nor needs the other families; Requires-Dist keeps only what the Atari path imports; RECORD is rewritten;
* dm-env and optree, which envpool's Python layer imports and the GPU machine lacks (dm-env's own dependency dm-tree
  is imported only by its test utilities, so it stays behind; gymnasium comes with ``GPU_WHEELS``).

Usage: ``python benchmarks/envpool_wheel.py [--out .whl]``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from zipfile import ZIP_DEFLATED, ZipFile, ZipInfo

ENVPOOL, ASSETS = "envpool==1.2.5", "envpool-assets==0.3.0"
DEPENDENCIES = ["dm-env==1.6", "optree==0.20.0"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
DIST_INFO = "envpool-1.2.5.dist-info/"
KEEP = ("envpool/__init__.py", "envpool/entry.py", "envpool/registration.py", "envpool/py.typed", "envpool/python/",
        "envpool/atari/", DIST_INFO + "METADATA", DIST_INFO + "WHEEL", DIST_INFO + "top_level.txt")
REQUIRES = {"dm-env", "gymnasium", "numpy", "optree", "typing-extensions"}  # what envpool/python/*.py imports
ENTRY = b'''"""Entry point for the envs' registration: Atari only (trimmed by tdrl's benchmarks/envpool_wheel.py)."""

import envpool.atari.registration  # noqa: F401
'''


def download(specs: list[str], dest: Path) -> None:
    """``pip download`` the cp312 manylinux x86_64 wheels of ``specs`` into ``dest``, without their dependencies."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest), *specs],
                   check=True)


def requires_needed(line: str) -> bool:
    """Whether a METADATA line stays: every line but the Requires-Dist that the Atari path does not import."""
    match = re.match(r"Requires-Dist: *([A-Za-z0-9._-]+)", line)
    return match is None or match[1].lower().replace("_", "-") in REQUIRES


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack(envpool_whl: Path, assets_whl: Path, out: Path) -> Path:
    """Write the Atari-only envpool wheel into ``out`` (same name as ``envpool_whl``) and return its path."""
    files: dict[str, tuple[bytes, int]] = {}  # name in the wheel -> (content, zip external_attr)
    with ZipFile(envpool_whl) as whl:
        for info in whl.infolist():
            if info.filename.startswith(KEEP):
                files[info.filename] = whl.read(info), info.external_attr
    with ZipFile(assets_whl) as whl:
        for info in whl.infolist():
            if info.filename.startswith("envpool_assets/atari/roms/") and not info.is_dir():
                files[info.filename.replace("envpool_assets/", "envpool/", 1)] = whl.read(info), 0o644 << 16
    files["envpool/entry.py"] = ENTRY, files["envpool/entry.py"][1]
    metadata, attr = files[DIST_INFO + "METADATA"]
    lines = metadata.decode().splitlines(keepends=True)
    files[DIST_INFO + "METADATA"] = "".join(filter(requires_needed, lines)).encode(), attr
    record = [record_line(name, data) for name, (data, _) in files.items()] + [DIST_INFO + "RECORD,,"]
    files[DIST_INFO + "RECORD"] = ("\n".join(record) + "\n").encode(), 0o644 << 16
    with ZipFile(out / envpool_whl.name, "w", ZIP_DEFLATED, compresslevel=9) as whl:
        for name, (data, attr) in files.items():
            info = ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr, info.compress_type = attr, ZIP_DEFLATED
            whl.writestr(info, data)
    return out / envpool_whl.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".whl"), help="folder for the wheels (default: .whl)")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        download([ENVPOOL, ASSETS], Path(tmp))
        trimmed = repack(next(Path(tmp).glob("envpool-*.whl")), next(Path(tmp).glob("envpool_assets-*.whl")), out)
    download(DEPENDENCIES, out)
    print(f"{trimmed}: {trimmed.stat().st_size / 2**20:.1f} MiB, with {', '.join(DEPENDENCIES)}")


if __name__ == "__main__":
    main()

"""``python -m bench mounts``: reading a staged squashfs image through each way of mounting it.

``ocistage stage BUNDLE --format squashfs`` makes ``TO/NAME.sqfs`` (and mounts it); this
harness then reads the whole tree (``tar -cf - . | cat > /dev/null``: every file's data, every
directory and inode) through, in alternating order between repetitions:

- ``squashfuse_ll``  ``ocistage.stagers.squashfs.mount``, as ``stage`` mounts: squashfuse_ll
                     where installed, ``-o allow_other,default_permissions``
- ``squashfuse``     the high-level squashfuse with the same options (what ``stage`` used
                     before, and still uses where squashfuse_ll is missing)
- ``kernel``         the kernel's squashfs (``mount -t squashfs -o loop,ro``; root only): the
                     reference, ratios are against it (goal: the FUSE mount <= 1.6x)

Each read gets a fresh mount (nothing of the tree in the page cache), of an image file that is
in the page cache (so the tools' own cost is what differs, not the disk). The image is the
bench image ``--image`` (default ``single``: ~200 MB, ~10k files sliced from /usr,
:mod:`bench.images`), bundled with ``ocistage bundle``. Raw samples:
``bench/results/mounts-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bundle import RESULTS, ocistage_env, ocistage_script, run_timed
from bench.images import SPECS, build_all, cache_root
from ocistage.cache.treeremoval import remove_tree

READ = 'tar -C "$1" -cf - . | cat > /dev/null'


def fuse_mount(tool: str) -> Callable[[Path, Path], None]:
    def mount_with(image: Path, mountpoint: Path) -> None:
        if tool == "squashfuse_ll":
            from ocistage.stagers.squashfs import mount, squashfuse_tools

            if not squashfuse_tools()[0].endswith("squashfuse_ll") or not mount(image,
                                                                                 mountpoint):
                raise RuntimeError("ocistage did not mount with squashfuse_ll")
            return
        subprocess.run([tool, "-o", "allow_other,default_permissions", str(image),
                        str(mountpoint)], check=True, timeout=60)
    return mount_with


def kernel_mount(image: Path, mountpoint: Path) -> None:
    subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro", str(image), str(mountpoint)],
                   check=True, timeout=60)


def take_down(mountpoint: Path) -> None:
    subprocess.run(["umount", str(mountpoint)], check=True, timeout=60)


def read_through(name: str, mount: Callable[[Path, Path], None], image: Path,
                 mountpoint: Path) -> float:
    mountpoint.mkdir()
    mount(image, mountpoint)
    try:
        seconds, _, _ = run_timed(["sh", "-c", READ, "sh", str(mountpoint)])
    finally:
        take_down(mountpoint)
        mountpoint.rmdir()
    return seconds


def staged_image(image_name: str, work: Path) -> Path:
    """``ocistage bundle`` of the bench image, staged with ``--format squashfs``; the image
    file (the mount ``stage`` made is taken down: every read mounts afresh)."""
    built = build_all([image_name])[image_name]
    env = ocistage_env(work / "cache", work / "home")
    (work / "home").mkdir(parents=True, exist_ok=True)
    bundle = work / "bundle"
    subprocess.run([ocistage_script(), "bundle", "-q", f"oci:{built.layout}:{built.name}",
                    str(bundle)], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([ocistage_script(), "stage", "-q", str(bundle), "--to", str(work / "to"),
                    "--format", "squashfs", "--name", "image"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    staged = work / "to" / "image"
    if os.path.ismount(staged):
        take_down(staged)
    return work / "to" / "image.sqfs"


def _summary(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {name: {"median": statistics.median(values), "min": min(values),
                   "max": max(values)} for name, values in samples.items() if values}


def render(result: dict[str, Any]) -> str:
    summary = result["summary"]
    kernel = summary.get("kernel", {}).get("median")
    lines = [f"{'mount':14} {'median s':>9} {'min s':>7} {'max s':>7} {'vs kernel':>10}"]
    for name, values in summary.items():
        ratio = f"{values['median'] / kernel:9.2f}x" if kernel else "        -"
        lines.append(f"{name:14} {values['median']:9.2f} {values['min']:7.2f} "
                     f"{values['max']:7.2f} {ratio}")
    lines.append(f"(image {result['image']}: {result['image_bytes'] >> 20} MB squashfs, "
                 f"{result['entries']} entries; goal: squashfuse_ll <= 1.6x kernel)")
    return "\n".join(lines)


def measure(image_name: str, reps: int, report: bool = True) -> dict[str, Any]:
    """Read the staged squashfs of ``image_name`` ``reps`` times through each way of mounting
    it here; the result document (:func:`render` prints it)."""
    mounts: dict[str, Callable[[Path, Path], None]] = {
        name: fuse_mount(name) for name in ("squashfuse_ll", "squashfuse") if shutil.which(name)}
    if os.geteuid() == 0:
        mounts["kernel"] = kernel_mount
    work = cache_root() / f"mounts-work-{os.getpid()}"
    load = os.getloadavg()
    samples: dict[str, list[float]] = {name: [] for name in mounts}
    try:
        image = staged_image(image_name, work)
        for rep in range(max(1, reps)):
            order = list(mounts) if rep % 2 == 0 else list(reversed(mounts))
            for name in order:
                samples[name].append(read_through(name, mounts[name], image,
                                                  work / f"mnt-{name}"))
                if report:
                    print(f"  {name}: {samples[name][-1]:.2f} s", flush=True)
        entries = sum(len(dirs) + len(files) for _, dirs, files in os.walk(work / "bundle"))
        image_bytes = image.stat().st_size
    finally:
        subprocess.run([ocistage_script(), "unstage", "-q", str(work / "to" / "image")],
                       check=False, env=ocistage_env(work / "cache", work / "home"),
                       capture_output=True)
        remove_tree(work)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return {"when": stamp, "image": image_name, "image_bytes": image_bytes,
            "entries": entries, "reps": reps, "cpus": os.cpu_count(),
            "load_before": load, "load_after": os.getloadavg(), "samples": samples,
            "summary": _summary(samples)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench mounts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="reads per mount [5]")
    parser.add_argument("--image", default="single", choices=sorted(SPECS))
    args = parser.parse_args(argv)
    result = measure(args.image, args.reps)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"mounts-{result['when']}.json"
    out.write_text(json.dumps(result, indent=2))
    print(render(result))
    print(f"bench: raw samples in {out}")
    return 0

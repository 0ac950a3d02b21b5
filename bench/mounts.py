"""``python -m bench mounts``: reading a staged squashfs image through each way of mounting it.

``ocistage stage BUNDLE --format squashfs`` makes ``TO/NAME.sqfs`` (and mounts it); this
harness then reads the whole tree through each mount, by each reader, in alternating order
between repetitions:

- ``squashfuse_ll``  ``ocistage.stagers.squashfs.mount``, as ``stage`` mounts: squashfuse_ll
                     where installed, ``-o ro,allow_other,default_permissions``
- ``squashfuse``     the high-level squashfuse with the same options (what ``stage`` used
                     before, and still uses where squashfuse_ll is missing)
- ``kernel``         the kernel's squashfs (``mount -t squashfs -o loop,ro``; root only): the
                     reference, ratios are against it, reader by reader (goal: the FUSE mount
                     <= 1.6x)

Readers: ``tar`` (``tar -cf - . | cat > /dev/null``: every file's data, every directory and
inode, one request at a time) and ``parallel`` (``find -type f | xargs -P CPUS cat``: the
files' data by as many readers as there are CPUs). A FUSE mount answers every request of the
reader by a round trip to its server (squashfuse_ll: about four per file), so the harness
also reports the server's CPU time and how often it waited for a request (its voluntary
context switches): where the reader and the server run on different CPUs each round trip
wakes a CPU, which on a virtual machine can cost more than the work (docs/performance.md, G8).

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
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bundle import RESULTS, ocistage_env, ocistage_script, run_timed
from bench.images import SPECS, build_all, cache_root
from ocistage.cache.treeremoval import remove_tree

#: the readers: a shell script given the mountpoint ($1) and the CPU count ($2)
READERS = {
    "tar": 'tar -C "$1" -cf - . | cat > /dev/null',
    "parallel": 'cd "$1" && find . -type f -print0 | xargs -0 -r -P "$2" -n 256 cat > /dev/null',
}


def fuse_mount(tool: str) -> Callable[[Path, Path], None]:
    def mount_with(image: Path, mountpoint: Path) -> None:
        if tool == "squashfuse_ll":
            from ocistage.stagers.squashfs import mount, squashfuse_tools

            if not squashfuse_tools()[0].endswith("squashfuse_ll") or not mount(image,
                                                                                 mountpoint):
                raise RuntimeError("ocistage did not mount with squashfuse_ll")
            return
        subprocess.run([tool, "-o", "ro,allow_other,default_permissions", str(image),
                        str(mountpoint)], check=True, timeout=60)
    return mount_with


def kernel_mount(image: Path, mountpoint: Path) -> None:
    subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro", str(image), str(mountpoint)],
                   check=True, timeout=60)


def take_down(mountpoint: Path, server: int | None = None) -> None:
    """Unmount ``mountpoint``; with the pid of its FUSE server, wait until that has finished
    exiting (a few milliseconds after the unmount: until then it still shows its arguments,
    and the next mount at the same path would take it for its own server)."""
    subprocess.run(["umount", str(mountpoint)], check=True, timeout=60)
    deadline = time.monotonic() + 30
    while server is not None and running(server):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the FUSE server {server} of {mountpoint} did not exit")
        time.sleep(0.005)  # polling its exit: a process not ours to wait for


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has: only its parent, or
    here the init that adopted the daemon, has not collected it yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def fuse_server(mountpoint: Path) -> int | None:
    """The pid of the squashfuse process serving ``mountpoint`` (None: a kernel mount)."""
    wanted = os.fsencode(mountpoint)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]).startswith(b"squashfuse") and wanted in argv:
            return int(entry)
    return None


def server_usage(pid: int | None) -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of the process ``pid`` so far."""
    if pid is None:
        return 0.0, 0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    waits = next(int(line.split()[1]) for line in
                 Path(f"/proc/{pid}/status").read_text().splitlines()
                 if line.startswith("voluntary_ctxt_switches:"))
    return cpu, waits


def read_through(mount: Callable[[Path, Path], None], reader: str, image: Path,
                 mountpoint: Path) -> dict[str, float]:
    """Mount ``image`` afresh, read it all by ``reader``; seconds, and the FUSE server's CPU
    seconds and waits for a request during the read (0 for the kernel)."""
    mountpoint.mkdir()
    mount(image, mountpoint)
    server = None
    try:
        server = fuse_server(mountpoint)
        cpu, waits = server_usage(server)
        seconds, _, _ = run_timed(["sh", "-c", READERS[reader], "sh", str(mountpoint),
                                   str(os.cpu_count() or 1)])
        cpu_after, waits_after = server_usage(server)
    finally:
        take_down(mountpoint, server)
        mountpoint.rmdir()
    return {"seconds": seconds, "server_cpu": cpu_after - cpu,
            "server_waits": float(waits_after - waits), "load": os.getloadavg()[0]}


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
        take_down(staged, fuse_server(staged))
    return work / "to" / "image.sqfs"


def _summary(samples: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    summary = {}
    for name, reads in samples.items():
        if not reads:
            continue
        seconds = [read["seconds"] for read in reads]
        summary[name] = {"median": statistics.median(seconds), "min": min(seconds),
                         "max": max(seconds),
                         "server_cpu": statistics.median(read["server_cpu"] for read in reads),
                         "server_waits": statistics.median(read["server_waits"]
                                                           for read in reads)}
    return summary


def sample_name(mount: str, reader: str) -> str:
    return f"{mount} {reader}"


def render(result: dict[str, Any]) -> str:
    summary = result["summary"]
    lines = [f"{'mount':14} {'reader':9} {'median s':>9} {'min s':>7} {'max s':>7} "
             f"{'vs kernel':>10} {'server CPU s':>13} {'server waits':>13}"]
    for name, values in summary.items():
        mount, reader = name.split()
        kernel = summary.get(sample_name("kernel", reader), {}).get("median")
        ratio = f"{values['median'] / kernel:9.2f}x" if kernel else "        -"
        lines.append(f"{mount:14} {reader:9} {values['median']:9.2f} {values['min']:7.2f} "
                     f"{values['max']:7.2f} {ratio} {values['server_cpu']:13.2f} "
                     f"{values['server_waits']:13.0f}")
    lines.append(f"(image {result['image']}: {result['image_bytes'] >> 20} MB squashfs, "
                 f"{result['entries']} entries; load {result['load_before'][0]:.1f} -> "
                 f"{result['load_after'][0]:.1f}; goal: squashfuse_ll <= 1.6x kernel)")
    return "\n".join(lines)


def measure(image_name: str, reps: int, report: bool = True) -> dict[str, Any]:
    """Read the staged squashfs of ``image_name`` ``reps`` times through each way of mounting
    it here, by each reader; the result document (:func:`render` prints it)."""
    mounts: dict[str, Callable[[Path, Path], None]] = {
        name: fuse_mount(name) for name in ("squashfuse_ll", "squashfuse") if shutil.which(name)}
    if os.geteuid() == 0:
        mounts["kernel"] = kernel_mount
    work = cache_root() / f"mounts-work-{os.getpid()}"
    load = os.getloadavg()
    cases = [(mount, reader) for reader in READERS for mount in mounts]
    samples: dict[str, list[dict[str, float]]] = {sample_name(*case): [] for case in cases}
    try:
        image = staged_image(image_name, work)
        for rep in range(max(1, reps)):
            for mount, reader in cases if rep % 2 == 0 else list(reversed(cases)):
                name = sample_name(mount, reader)
                samples[name].append(read_through(mounts[mount], reader, image,
                                                  work / f"mnt-{mount}"))
                if report:
                    print(f"  {name}: {samples[name][-1]['seconds']:.2f} s", flush=True)
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

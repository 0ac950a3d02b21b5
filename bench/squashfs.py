"""``python -m bench squashfs``: mksquashfs block size x compressor, chosen by numbers.

For two trees, made once from this host's ``/usr`` (real files, so compressors see real data):

- ``small``  ``--small-files`` files (default 100,000) copied from ``/usr`` in a stable order,
             nested as found (the shape of a container's rootfs), each cut to its first
             ``SMALL_CAP`` (16 KiB: small files, ~0.5 GB in all)
- ``large``  ``--large-files`` files (default 4) of ``--large-mb`` MB in all (default 1024),
             each the concatenation of ``/usr`` files (libraries, binaries, text)

both holding a copy of this interpreter's binary as ``bin/python3`` (the start test), the
harness builds one image per (block size, compressor) — ``-b 128K/256K/1M`` x ``zstd`` at a few
levels, ``lz4``, ``gzip`` (what ``mksquashfs -help`` lists) — and for each image measures:

- ``build s``   mksquashfs with ``-processors 2`` (as ``stage`` and the importer run it)
- ``MB``        the image's size
- ``read1 s``   every file read through a fresh ``squashfuse_ll`` mount by one reader
                (``find -type f -print0 | xargs -0 -P1 cat > /dev/null``)
- ``read2 s``   the same with two parallel readers (``xargs -P2``)
- ``start s``   ``bin/python3 -c pass`` from a fresh mount: a process started from the image

Every image of a tree is built first; then each repetition reads every image once, in an
order reversed between repetitions, so a change of load hits them alike. The page cache is
dropped (root: ``/proc/sys/vm/drop_caches``) before each mount, so the image
is read from the disk as on a node that has just been given it; without root, or with
``--keep-page-cache`` (the readers' CPU cost alone), the image is read from memory and the
table says so. Raw samples: ``bench/results/squashfs-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bundle import drop_kernel_caches
from bench.images import cache_root, made_once
from ocistage.stagers.mksquashfs import compressors_listed, help_text

RESULTS = Path(__file__).parent / "results"
MB = 1 << 20
TREE_VERSION = 2
SMALL_CAP = 16 << 10
BLOCKS = ("128K", "256K", "1M")
#: (label, mksquashfs options); those whose compressor this mksquashfs lacks are left out
COMPRESSORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("zstd-3", ("-comp", "zstd", "-Xcompression-level", "3")),
    ("zstd-15", ("-comp", "zstd", "-Xcompression-level", "15")),
    ("lz4", ("-comp", "lz4")),
    ("gzip-6", ("-comp", "gzip", "-Xcompression-level", "6")),
)
READ = 'cd "$1" && find . -type f -print0 | xargs -0 -r -P "$2" -n 256 cat > /dev/null'


@dataclass
class Row:
    tree: str
    block: str
    compressor: str
    build_s: float
    image_bytes: int
    read1_s: list[float] = field(default_factory=list)
    read2_s: list[float] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)


def usr_files() -> Iterator[Path]:
    """Regular files of /usr in a stable order (sorted walk, not crossing filesystems)."""
    root_dev = os.stat("/usr").st_dev
    for top, dirs, files in os.walk("/usr"):
        dirs[:] = sorted(d for d in dirs if os.lstat(os.path.join(top, d)).st_dev == root_dev)
        for name in sorted(files):
            path = Path(top, name)
            try:
                if path.is_file() and not path.is_symlink() and os.access(path, os.R_OK):
                    yield path
            except OSError:
                continue


def add_python(tree: Path) -> None:
    (tree / "bin").mkdir(exist_ok=True)
    shutil.copy2(os.path.realpath(sys.executable), tree / "bin" / "python3")


def copy_head(path: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "rb") as source:
        dest.write_bytes(source.read(SMALL_CAP))


def make_small(root: Path, files: int) -> Path:
    def fill(work: Path) -> None:
        made = 0
        for path in usr_files():
            if made >= files:
                break
            copy_head(path, work / path.relative_to("/"))
            made += 1
        n = 0
        while made < files:  # /usr smaller than asked: copies again under another top dir
            for path in usr_files():
                if made >= files:
                    break
                copy_head(path, work / f"again{n}" / path.relative_to("/"))
                made += 1
            n += 1
        add_python(work)

    return made_once(root / f"sqfs-small-v{TREE_VERSION}-{files}", fill)


def make_large(root: Path, count: int, megabytes: int) -> Path:
    def fill(work: Path) -> None:
        (work / "data").mkdir(parents=True)
        each = megabytes * MB // count
        sources = usr_files()
        for n in range(count):
            with open(work / "data" / f"blob{n}", "wb") as out:
                while out.tell() < each:
                    try:
                        data = next(sources).read_bytes()[:each - out.tell()]
                    except StopIteration:
                        sources = usr_files()
                        continue
                    except OSError:
                        continue
                    out.write(data)
        add_python(work)

    return made_once(root / f"sqfs-large-v{TREE_VERSION}-{count}-{megabytes}", fill)


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


class Mounted:
    """``squashfuse_ll IMAGE MOUNTPOINT`` (foreground off), unmounted on exit."""

    def __init__(self, image: Path, mountpoint: Path) -> None:
        self.image = image
        self.mountpoint = mountpoint

    def __enter__(self) -> Path:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        subprocess.run(["squashfuse_ll", str(self.image), str(self.mountpoint)], check=True,
                       timeout=60, stdin=subprocess.DEVNULL)
        return self.mountpoint

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):
            done = subprocess.run(["fusermount", "-u", str(self.mountpoint)], check=False,
                                  capture_output=True)
            if done.returncode == 0 or not os.path.ismount(self.mountpoint):
                break
            time.sleep(0.1)
        self.mountpoint.rmdir()


def available(mksquashfs: str = "mksquashfs") -> list[tuple[str, tuple[str, ...]]]:
    listed = set(compressors_listed(help_text(mksquashfs)))
    return [(label, opts) for label, opts in COMPRESSORS if opts[1] in listed]


def build(tree: Path, image: Path, block: str, options: tuple[str, ...]) -> float:
    image.unlink(missing_ok=True)
    os.sync()
    return timed(["mksquashfs", str(tree), str(image), "-noappend", "-quiet", "-no-progress",
                  "-no-recovery", "-processors", "2", "-b", block, *options])


def measure(row: Row, image: Path, mnt: Path, drop: bool) -> None:
    for readers, into in ((1, row.read1_s), (2, row.read2_s)):
        if drop:
            drop_kernel_caches()
        with Mounted(image, mnt) as where:
            into.append(timed(["sh", "-c", READ, "sh", str(where), str(readers)]))
    if drop:
        drop_kernel_caches()
    with Mounted(image, mnt) as where:
        row.start_s.append(timed([str(where / "bin" / "python3"), "-S", "-c", "pass"]))


def render(rows: list[Row], dropped: bool) -> str:
    head = (f"{'tree':6} {'block':5} {'compressor':10} {'build s':>8} {'MB':>7} "
            f"{'read1 s':>8} {'read2 s':>8} {'start s':>8}")
    lines = [head, "-" * len(head)]
    for row in rows:
        lines.append(f"{row.tree:6} {row.block:5} {row.compressor:10} {row.build_s:8.2f} "
                     f"{row.image_bytes / MB:7.1f} {_med(row.read1_s):8.2f} "
                     f"{_med(row.read2_s):8.2f} {_med(row.start_s):8.3f}")
    lines.append("(page cache " + ("dropped before every mount" if dropped else
                                   "kept: the image read from memory") + "; medians)")
    return "\n".join(lines)


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(small_files: int, large_files: int, large_mb: int, reps: int,
        blocks: tuple[str, ...] = BLOCKS, compressors: list[str] | None = None,
        trees: tuple[str, ...] = ("small", "large"), drop: bool = True) -> dict[str, Any]:
    """Build and measure every image; the rows and whether the page cache was dropped."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    made = {"small": lambda: make_small(root, small_files),
            "large": lambda: make_large(root, large_files, large_mb)}
    chosen = [(label, opts) for label, opts in available()
              if compressors is None or label in compressors]
    dropped = drop and drop_kernel_caches()
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="sqfs-bench-", dir=root))
    try:
        for name in trees:
            tree = made[name]()
            built: list[tuple[Row, Path]] = []
            for block in blocks:
                for label, options in chosen:
                    image = work / f"{name}-{block}-{label}.sqfs"
                    built.append((Row(name, block, label, build(tree, image, block, options),
                                      image.stat().st_size), image))
            # reads side by side: every image once per repetition, the order reversed
            # between repetitions (A B C, C B A), so load changes hit them alike
            for rep in range(max(1, reps)):
                for row, image in built if rep % 2 == 0 else reversed(built):
                    measure(row, image, work / "mnt", dropped)
                    print(f"  rep {rep + 1}: " + render([row], dropped).splitlines()[2],
                          flush=True)
            rows += [row for row, _ in built]
            for _, image in built:
                image.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"rows": [asdict(r) for r in rows], "page_cache_dropped": dropped,
            "text": render(rows, dropped)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench squashfs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small-files", type=int, default=100_000)
    parser.add_argument("--large-files", type=int, default=4)
    parser.add_argument("--large-mb", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=1, help="reads per image [1]")
    parser.add_argument("--blocks", default=",".join(BLOCKS))
    parser.add_argument("--compressors", default=",".join(c for c, _ in COMPRESSORS))
    parser.add_argument("--trees", default="small,large")
    parser.add_argument("--keep-page-cache", action="store_true",
                        help="do not drop the page cache before mounts: the image is read "
                             "from memory, the readers' CPU cost alone (what mounts.py does)")
    parser.add_argument("--quick", action="store_true",
                        help="10k small files, 256 MB large, 128K and 1M blocks")
    args = parser.parse_args(argv)
    missing = [t for t in ("mksquashfs", "squashfuse_ll", "fusermount") if not shutil.which(t)]
    if missing:
        print(f"bench: missing {', '.join(missing)}", file=sys.stderr)
        return 1
    if args.quick:
        args.small_files, args.large_mb, args.blocks = 10_000, 256, "128K,1M"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    load = os.getloadavg()
    result = run(args.small_files, args.large_files, args.large_mb, args.reps,
                 tuple(args.blocks.split(",")), args.compressors.split(","),
                 tuple(args.trees.split(",")), drop=not args.keep_page_cache)
    print(result["text"])
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"squashfs-{stamp}.json"
    out.write_text(json.dumps({"when": stamp, "load_before": load,
                               "load_after": os.getloadavg(), "argv": argv, **result},
                              indent=2))
    print(f"bench: raw results in {out}")
    return 0

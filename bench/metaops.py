"""``python -m bench metaops``: what a 1%-changed re-stage costs a parallel filesystem.

On Lustre or GPFS every metadata operation (a stat, an open, a link, a rename, an unlink) is a
round trip to a metadata server, so the count of them is what a re-stage costs there, whatever
the local CPU time. This counts them with ``strace -c -f`` (counts, not times: the result does
not depend on how busy the machine is) for one re-stage of a tree of FILES small files of which
1% changed:

- ``ocistage stage`` (an atomic new version; the replaced one is removed, as no job holds it);
- ``rsync -a --link-dest=OLD SRC/ NEW/``, the peer with the same contract (plus removing OLD
  afterwards, which the table adds as one unlink per entry of OLD);
- ``rsync -a SRC/ DEST/`` in place (torn reads for a running job), for reference.

The tree is made on ``--dir`` (default /dev/shm); results are printed as a table and written
as JSON to bench/results/metaops-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
GROUPS = {
    "stat": ("newfstatat", "statx", "lstat", "stat", "fstat"),
    "open": ("openat", "open"),
    "link": ("link", "linkat"),
    "rename": ("rename", "renameat", "renameat2"),
    "unlink": ("unlink", "unlinkat", "rmdir"),
    "mkdir": ("mkdir", "mkdirat"),
    "utime/chmod": ("utimensat", "fchmod", "fchmodat"),
}
CHANGES = ("link", "rename", "unlink", "mkdir", "utime/chmod")


def make_tree(root: Path, files: int) -> None:
    per_dir = 100
    for n in range(files):
        directory = root / f"d{n // (per_dir * 10)}" / f"e{(n // per_dir) % 10}"
        if n % per_dir == 0:
            directory.mkdir(parents=True)
        (directory / f"f{n % per_dir}").write_bytes(os.urandom(64))


def change(root: Path, every: int) -> int:
    changed = 0
    for n, path in enumerate(sorted(p for p in root.rglob("*") if p.is_file())):
        if n % every == 0:
            path.write_bytes(os.urandom(64))
            changed += 1
    return changed


def counted(argv: list[str], out: Path) -> dict[str, int]:
    """Run ``argv`` under ``strace -c -f``; the calls per system call."""
    subprocess.run(["strace", "-f", "-c", "-o", str(out), *argv], check=True,
                   stdout=subprocess.DEVNULL)
    calls: dict[str, int] = {}
    for line in out.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0][:1].isdigit():
            calls[fields[-1]] = int(fields[3])
    return calls


def grouped(calls: dict[str, int]) -> dict[str, int]:
    result = {group: sum(calls.get(name, 0) for name in names)
              for group, names in GROUPS.items()}
    result["metadata changes"] = sum(result[group] for group in CHANGES)
    return result


def measure(files: int, where: Path, ocistage: str) -> tuple[dict[str, dict[str, int]], int]:
    """The grouped system calls of each tool's 1%-changed re-stage of ``files`` files (a tree
    made under ``where``), and how many files changed."""
    work = where / f"ocistage-metaops-{os.getpid()}"
    saved = dict(os.environ)
    try:
        source = work / "src"
        make_tree(source, files)
        env = {**os.environ, "OCISTAGE_CACHE": str(work / "cache")}
        stage = [ocistage, "stage", str(source), "--to", str(work / "target"), "--name", "x",
                 "-q"]
        subprocess.run(stage, check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["rsync", "-a", f"{source}/", f"{work / 'old'}/"], check=True)
        subprocess.run(["cp", "-a", str(work / "old"), str(work / "inplace")], check=True)
        changed = change(source, 100)
        os.environ.update(env)
        rows = {
            "ocistage": grouped(counted(stage, work / "st-ocistage")),
            "rsync --link-dest": grouped(counted(
                ["rsync", "-a", f"--link-dest={work / 'old'}", f"{source}/",
                 f"{work / 'new'}/"], work / "st-linkdest")),
            "rsync in place": grouped(counted(
                ["rsync", "-a", f"{source}/", f"{work / 'inplace'}/"], work / "st-inplace")),
        }
        entries = sum(1 for _ in (work / "old").rglob("*")) + 1
        removal = dict.fromkeys(rows["ocistage"], 0)
        removal.update({"unlink": entries, "metadata changes": entries})
        rows["rsync --link-dest + rm OLD"] = {key: rows["rsync --link-dest"][key] + removal[key]
                                              for key in removal}
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(work, ignore_errors=True)
    return rows, changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench metaops", description=__doc__)
    parser.add_argument("--files", type=int, default=100_000, help="files in the tree [100000]")
    parser.add_argument("--dir", default="/dev/shm", help="where the trees go [/dev/shm]")
    args = parser.parse_args(argv)
    if shutil.which("strace") is None or shutil.which("rsync") is None:
        print("bench metaops: needs strace and rsync (apt-get install strace rsync)",
              file=sys.stderr)
        return 1
    rows, changed = measure(args.files, Path(args.dir), shutil.which("ocistage") or "ocistage")
    names = list(rows)
    print(f"{args.files} files, {changed} changed; system calls (strace -c -f)")
    print(f"{'':18}" + "".join(f"{name:>28}" for name in names))
    for key in rows["ocistage"]:
        print(f"{key:18}" + "".join(f"{rows[name][key]:>28}" for name in names))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"metaops-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps({"files": args.files, "changed": changed, "rows": rows}, indent=1))
    print(f"raw: {out}")
    return 0

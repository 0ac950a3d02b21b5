"""``python -m bench pyxisphases``: where a cold importer ``get`` and ``enroot import`` spend
their time, phase by phase, on the image of ``python -m bench pyxis``.

The get runs as pyxis runs it (its environment, an empty cache and store), in a Python that
wraps the importer's steps before it starts (:data:`PROFILER`): each step's wall time, this
process's CPU time (every thread) and its children's (mksquashfs), from the step's start to
its end. ``enroot import`` is a shell script: its phases are the times of its ``[INFO]`` lines
(download, extraction, whiteouts, mksquashfs), and its CPU the whole command's. The two
alternate, ``--reps`` times; ``--work DIR`` puts their homes on another filesystem (a tmpfs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.bundle import running_registry
from bench.images import MB, cache_root
from bench.pyxis import enroot_env, enroot_or_say, importer_env, push_v2s2
from bench.synthetic import SynthSpec, build_synthetic
from ocistage.cache.treeremoval import remove_tree

#: run in the importer's Python: wrap its steps, run ``get URI``, write the marks to
#: $PHASES_OUT as [label, start, wall, cpu, children's cpu]
PROFILER = r"""
import json, os, resource, sys, time
T0, C0 = time.perf_counter(), time.process_time()
marks = []
def now():
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), time.process_time(), ch.ru_utime + ch.ru_stime
def wrap(owner, name, label):
    orig = getattr(owner, name)
    def inner(*a, **k):
        s = now()
        try:
            return orig(*a, **k)
        finally:
            e = now()
            marks.append((label, s[0] - T0, e[0] - s[0], e[1] - s[1], e[2] - s[2]))
    setattr(owner, name, inner)
s = now()
import ocistage.bundler.pyxis.build as B, ocistage.bundler.pyxis.cachesource as CS
import ocistage.bundler.pyxis.get as G, ocistage.bundler.pyxis.imagestore as IS
import ocistage.bundler.rootfs as RF, ocistage.cache.store as ST
from ocistage.bundler.pyxis import main as M
e = now()
marks.append(("imports", 0.0, e[0] - T0, e[1] - C0, 0.0))
wrap(G, "get", "get, in all")
wrap(CS.LeasedCache, "bundle", "pull + unpack (overlapped)")
wrap(B, "image_key", "  manifest resolved (the key)")
wrap(RF, "apply_layers", "  the layers, as they arrive")
wrap(B, "enroot_files", "enroot's files")
wrap(B, "run_mksquashfs", "mksquashfs")
wrap(IS.ImageStore, "publish", "publish")
wrap(ST.Store, "remove_temp_dir", "remove scratch")
wrap(CS.CacheSource, "drop_pulled", "drop_pulled")
try:
    code = M.run(["get", sys.argv[1]])
except SystemExit as exc:
    code = exc.code
e = now()
marks.append(("process", 0.0, e[0] - T0, e[1] - C0, e[2]))
with open(os.environ["PHASES_OUT"], "w") as out:
    json.dump(marks, out)
sys.exit(code)
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def enroot_phases(uri: str, enroot: Path, home: Path) -> dict[str, Any]:
    """``enroot import`` with the time of each ``[INFO]`` line it prints."""
    os.sync()
    (home / "out").mkdir(parents=True)
    cpu, start = _cpu(), time.perf_counter()
    process = subprocess.Popen(["enroot", "import", "-o", str(home / "out" / "i.sqsh"), uri],
                               env=enroot_env(enroot, home), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    assert process.stdout is not None
    lines = [(time.perf_counter() - start, raw.decode(errors="replace").strip())
             for raw in process.stdout if b"[INFO]" in raw]
    if process.wait() != 0:
        raise RuntimeError(f"enroot import exited {process.returncode}")
    return {"wall": time.perf_counter() - start, "cpu": _cpu() - cpu, "lines": lines}


def get_phases(uri: str, home: Path) -> dict[str, Any]:
    """A cold get under :data:`PROFILER`."""
    os.sync()
    env = importer_env(home, PHASES_OUT=str(home / "phases.json"))
    cpu, start = _cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROFILER, uri], env=env, capture_output=True,
                          stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"get exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    marks = json.loads((home / "phases.json").read_text())
    return {"wall": time.perf_counter() - start, "cpu": _cpu() - cpu,
            "marks": sorted(marks, key=lambda mark: mark[1])}


def render(enroot: dict[str, Any], get: dict[str, Any]) -> str:
    lines = [f"enroot import: {enroot['wall']:.2f} s, CPU {enroot['cpu']:.2f} s"]
    times = [*enroot["lines"], (enroot["wall"], "(done)")]
    lines += [f"  {times[n][1][:40]:40} from {times[n][0]:6.2f} s for "
              f"{times[n + 1][0] - times[n][0]:6.2f} s" for n in range(len(times) - 1)]
    lines.append(f"get: {get['wall']:.2f} s, CPU {get['cpu']:.2f} s "
                 "(wall, CPU of the importer, CPU of its children)")
    lines += [f"  {label:32} at {at:6.2f} {wall:6.2f} {cpu:6.2f} {children:6.2f}"
              for label, at, wall, cpu, children in get["marks"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench pyxisphases", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=2, help="repetitions [2]")
    parser.add_argument("--files", type=int, default=10_000, help="files in the image [10000]")
    parser.add_argument("--megabytes", type=int, default=200, help="bytes of files, MB [200]")
    parser.add_argument("--work", type=Path, help="homes here (e.g. a tmpfs) [bench cache]")
    args = parser.parse_args(argv)
    enroot = enroot_or_say()
    if enroot is None:
        return 1
    image = build_synthetic(SynthSpec(args.files, args.megabytes * MB), ("gzip",))["gzip"]
    root = cache_root()
    work = (args.work or root) / f"pyxisphases-{os.getpid()}"
    try:
        with running_registry(root / "registry" / "storage") as registry:
            uri = push_v2s2(image, registry.host)
            for rep in range(max(1, args.reps)):
                print(f"-- repetition {rep + 1}, load {os.getloadavg()[0]:.1f}", flush=True)
                remove_tree(work)
                first = enroot_phases(uri, enroot, work / "enroot")
                remove_tree(work)
                print(render(first, get_phases(uri, work / "importer")), flush=True)
    finally:
        remove_tree(work)
    return 0

"""Micro-benchmark of one layer's apply: an uncompressed tar, in memory, onto tmpfs.

``python -m bench.applybench [--files N] [--size MB] [--reps R] [TREE ...]`` generates (once,
cached in ``/dev/shm/ocistage-applybench/``) one layer of ``bench.synthetic``'s shape (files of
log-normal sizes in ``data/dNNN/dNN/`` directories, a symlink every 50 files, PAX format) and
times :func:`ocistage.bundler.unpack.apply.apply_layer` on it, the tar read from memory, into a
fresh directory under ``/dev/shm``: the applier's own cost (parsing, path resolution, system
calls), without download, decompression or hashing. With TREEs (worktrees of ocistage), each
rep runs every tree once in its own process, alternating, and the medians and their ratio to
the first tree are printed. ``--profile`` runs cProfile in this process instead (the code of
``PYTHONPATH``); ``--opcodes`` counts the bytecodes and Python calls per entry of each TREE's
apply (``sys.settrace``: exact, whatever the load). ``--bundle`` times cold ``ocistage bundle``
end to end instead, A/B over the TREEs and the floor (``curl | gzip -dc | tar -x`` per layer),
with :mod:`bench.scale`'s synthetic image of ``--files``/``--size`` (four gzip layers) in a
local registry; the page cache is not dropped (the registry's blobs stay in memory) and the
bundles and caches are written under ``--work`` (``$OCISTAGE_BENCH_CACHE``, ext4, by default;
``/dev/shm``: tmpfs).
Not part of ``python -m bench``: a tool for working on the applier.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

SHM = Path("/dev/shm/ocistage-applybench")
MB = 1 << 20

_TIMED = """
import io, sys, time, tempfile, shutil
from pathlib import Path
from ocistage.bundler.unpack.apply import apply_layer
data = Path(sys.argv[1]).read_bytes()
target = Path(tempfile.mkdtemp(dir=sys.argv[2]))
start, cpu = time.perf_counter(), time.process_time()
apply_layer(io.BytesIO(data), target)
print(time.perf_counter() - start, time.process_time() - cpu)
shutil.rmtree(target)
"""


_OPCODES = """
import io, sys, tempfile, shutil
from pathlib import Path
from ocistage.bundler.unpack.apply import apply_layer
from ocistage.bundler.unpack.tarstream import tarinfo_class
data = Path(sys.argv[1]).read_bytes()
tarinfo_class()  # its one-time self-check is not counted
counts = {"opcode": 0, "call": 0}
def tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    if event in counts:
        counts[event] += 1
    return tracer
target = Path(tempfile.mkdtemp(dir=sys.argv[2]))
sys.settrace(tracer)
report = apply_layer(io.BytesIO(data), target)
sys.settrace(None)
shutil.rmtree(target)
print(report.entries, counts["opcode"], counts["call"])
"""


def count_opcodes(trees: list[Path], tar: Path) -> None:
    """Bytecodes and Python calls per entry of each tree's apply (``sys.settrace``): exact
    and independent of the machine's load, unlike its time; C work counts as one call."""
    for tree in trees:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, "-c", _OPCODES, str(tar), str(SHM)], env=env,
                             cwd=tree, check=True, capture_output=True, text=True).stdout
        entries, opcodes, calls = (int(x) for x in out.split())
        print(f"{tree}: {entries} entries, {opcodes / entries:.0f} bytecodes and "
              f"{calls / entries:.1f} Python calls per entry")


def layer_tar(files: int, size: int) -> Path:
    """The cached tar of one layer of ``files`` files and ``size`` bytes."""
    from bench.synthetic import SynthSpec, _file_sizes, _text_pool, _write_layer

    path = SHM / f"layer-{files}f-{size // MB}m.tar"
    if path.is_file():
        return path
    SHM.mkdir(parents=True, exist_ok=True)
    spec = SynthSpec(files, size, layers=1)
    rng = random.Random(spec.seed)
    sizes = _file_sizes(spec, rng)
    text = _text_pool(rng) * 2
    partial = path.with_suffix(".partial")
    with (open(partial, "wb") as raw, io.BufferedWriter(raw, buffer_size=MB) as buffered,
          tarfile.open(fileobj=buffered, mode="w|", format=tarfile.PAX_FORMAT) as tar):
        _write_layer(tar, range(files), sizes, rng, text)
    os.replace(partial, path)
    return path


def _run(tree: Path, tar: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # run in the tree: ``python -c`` puts the working directory first on sys.path
    out = subprocess.run([sys.executable, "-c", _TIMED, str(tar), str(SHM)], env=env,
                         cwd=tree, check=True, capture_output=True, text=True).stdout
    wall, cpu = out.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def compare(trees: list[Path], tar: Path, reps: int) -> None:
    """Wall and CPU seconds (the process's, user + system) of each tree, alternating: on a
    loaded machine the CPU time is the steadier of the two."""
    times: dict[Path, list[tuple[float, float]]] = {tree: [] for tree in trees}
    for rep in range(reps):
        order = trees if rep % 2 == 0 else list(reversed(trees))
        for tree in order:
            times[tree].append(_run(tree, tar))
    base = [statistics.median(t[i] for t in times[trees[0]]) for i in (0, 1)]
    for tree in trees:
        wall, cpu = (statistics.median(t[i] for t in times[tree]) for i in (0, 1))
        samples = " ".join(f"{t[0]:.2f}/{t[1]:.2f}" for t in times[tree])
        print(f"{tree}: wall {wall:.3f} s ({wall / base[0]:.2f}x), cpu {cpu:.3f} s "
              f"({cpu / base[1]:.2f}x)  [wall/cpu: {samples}]")


def profile(tar: Path) -> None:
    import cProfile
    import pstats
    import tempfile

    from ocistage.bundler.unpack.apply import apply_layer

    data = tar.read_bytes()
    target = Path(tempfile.mkdtemp(dir=SHM))
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    apply_layer(io.BytesIO(data), target)
    profiler.disable()
    print(f"apply: {time.perf_counter() - start:.3f} s (profiled)")
    shutil.rmtree(target)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def compare_bundles(trees: list[Path], files: int, size: int, reps: int,
                    where: Path | None) -> None:
    """Cold ``ocistage bundle`` of each tree and the floor, alternating, medians."""
    from bench.bundle import Workspace, ocistage_bundle, run_floor, running_registry
    from bench.images import cache_root, push
    from bench.synthetic import SynthSpec, build_synthetic
    from ocistage.cache.treeremoval import remove_tree

    image = build_synthetic(SynthSpec(files, size), ("gzip",))["gzip"]
    root = cache_root()
    work = Workspace((where or root) / "applybench-work")
    runs: dict[str, list[float]] = {str(tree): [] for tree in trees}
    runs["floor"] = []
    try:
        with running_registry(root / "scale-registry" / "storage") as registry:
            ref = push(image, registry.host)
            names = list(runs)
            for rep in range(reps):
                for name in names if rep % 2 == 0 else list(reversed(names)):
                    if name == "floor":
                        runs[name].append(run_floor(image, registry.host, work).seconds)
                    else:
                        os.environ["PYTHONPATH"] = name
                        runs[name].append(run_ocistage_cold(ref, work, ocistage_bundle))
                    work.clear()
    finally:
        remove_tree(work.root)
    floor = statistics.median(runs["floor"])
    base = statistics.median(runs[names[0]])
    for name, samples in runs.items():
        median = statistics.median(samples)
        print(f"{name}: median {median:.3f} s ({median / base:.2f}x the first, "
              f"{median / floor:.2f}x the floor)  [{' '.join(f'{t:.3f}' for t in samples)}]")


def run_ocistage_cold(ref: str, work: Any, bundle: Any) -> float:
    return float(bundle(ref, work.fresh("bundle"), work.fresh("cache"), work).seconds)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.applybench")
    parser.add_argument("--files", type=int, default=30_000)
    parser.add_argument("--size", type=int, default=100, help="MB of file data")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--opcodes", action="store_true",
                        help="bytecodes per entry (slow: use --files 3000 --size 10)")
    parser.add_argument("--bundle", action="store_true", help="cold ocistage bundle A/B")
    parser.add_argument("--work", type=Path, help="where --bundle writes (/dev/shm: tmpfs)")
    parser.add_argument("trees", nargs="*", type=Path)
    args = parser.parse_args(argv)
    if args.bundle:
        print(f"load {os.getloadavg()[0]:.2f}", flush=True)
        compare_bundles(args.trees or [Path.cwd()], args.files, args.size * MB, args.reps,
                        args.work)
        return 0
    tar = layer_tar(args.files, args.size * MB)
    print(f"layer {tar} ({tar.stat().st_size // MB} MB); load {os.getloadavg()[0]:.2f}",
          flush=True)
    if args.profile:
        profile(tar)
    elif args.opcodes:
        count_opcodes(args.trees or [Path.cwd()], tar)
    else:
        compare(args.trees or [Path.cwd()], tar, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

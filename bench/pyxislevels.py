"""``python -m bench pyxislevels``: the importer's cold ``get`` at each squashfs compression,
with and without ``pyxis_squashfs_only``, against ``enroot import`` of the same image.

For the choice of the importer's default compression (DESIGN.md G9: a cold get at most 0.5x
``enroot import``; an image at most 2x its compressed size in the importer's store, 1.1x with
``pyxis_squashfs_only``). Two images, each pushed as Docker v2s2 to a loopback
``docker-registry`` (:mod:`bench.pyxis`): the synthetic one of ``python -m bench pyxis``
(``--files`` files of ``--megabytes`` MB, four gzip layers) and Debian's Python library as one
gzip layer (the image of tests/e2e/test_pyxis_store.py). Cases, alternating in order between
repetitions: ``enroot`` (``enroot import``, empty enroot cache) and, for every compression of
``--compressions`` (``OCISTAGE_PYXIS_COMPRESSION``), a cold get into an empty cache with the
default store and with ``OCISTAGE_PYXIS_SQUASHFS_ONLY=1``. Per sample: wall seconds, the CPU
seconds of the command and its children, and for a get the bytes the importer's cache keeps
(its blobs and ``pyxis/``: what tests/e2e/test_pyxis_store.py counts). Printed: medians,
get / enroot, store / compressed; raw samples in ``bench/results/pyxislevels-<UTC>.json``.
``--work DIR`` puts the scratch homes (enroot's and the importer's) on another filesystem,
e.g. a tmpfs, to compare CPU cost without the disk (DESIGN.md, Performance).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import tarfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bundle import RESULTS, running_registry
from bench.images import MB, BuiltImage, _Layout, _sha256, add_image, cache_root, made_once
from bench.pyxis import (
    enroot_env,
    enroot_or_say,
    importer_argv,
    importer_env,
    push_v2s2,
)
from bench.synthetic import SynthSpec, build_synthetic
from ocistage.cache.treeremoval import remove_tree

COMPRESSIONS = ("zstd:1", "zstd:3", "zstd:6", "lz4")
PYLIB = Path("/usr/lib/python3.11")


@dataclass
class Measured:
    seconds: float
    cpu: float
    store_bytes: int = 0


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the command and its children, stdout)."""
    os.sync()  # earlier runs' dirty data is not this one's to write back
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, stdin=subprocess.DEVNULL,
                          check=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: "
                           f"{done.stderr.decode(errors='replace')[-2000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return seconds, cpu, done.stdout.decode()


def store_bytes(cache: Path) -> int:
    """The bytes of the importer's cache that an image costs: its blobs and ``pyxis/``."""
    return sum(p.stat().st_size for part in ("blobs", "pyxis") for p in (cache / part).rglob("*")
               if p.is_file() and not p.is_symlink())


def compressed_bytes(image: BuiltImage) -> int:
    """The image's manifest, config and layers as stored (what the registry serves)."""
    layout = _Layout(image.layout)
    manifest = json.loads(layout.blob(image.manifest_digest).read_bytes())
    digests = [image.manifest_digest, manifest["config"]["digest"],
               *(layer["digest"] for layer in manifest["layers"])]
    return sum(layout.blob(d).stat().st_size for d in digests)


def pylib_image(root: Path) -> BuiltImage:
    """Debian's Python library (without bytecode and installed packages) as one gzip layer,
    built once in ``root``."""
    def fill(work: Path) -> None:
        tree = work / "tree"
        shutil.copytree(PYLIB, tree, symlinks=True, ignore=shutil.ignore_patterns(
            "__pycache__", "site-packages", "dist-packages"))
        layer = work / "layer.tar"
        with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(tree, arcname="usr/lib/python3.11")
        diff_id = _sha256(layer)
        subprocess.run(["gzip", "-6", "-n", str(layer)], check=True)
        layout = _Layout(work / "layout")
        digest, size = layout.add_file(work / "layer.tar.gz")
        add_image(layout, "pylib", [(digest, diff_id, size)], "gzip", env_path="/usr/bin",
                  cmd="/bin/sh", history="python library")
        remove_tree(tree)

    built = made_once(root / "pyxislevels-pylib-v1", fill)
    layout = _Layout(built / "layout")
    manifest_digest = json.loads((built / "layout" / "index.json").read_text())[
        "manifests"][0]["digest"]
    manifest = json.loads(layout.blob(manifest_digest).read_bytes())
    layers = tuple((layer["digest"], "gzip") for layer in manifest["layers"])
    size = sum(layer["size"] for layer in manifest["layers"])
    return BuiltImage("pylib", built / "layout", manifest_digest, layers, (), 0, 0, size)


def pylib_store() -> tuple[int, int]:
    """One cold ``get`` of Debian's Python library with the importer's defaults: (the bytes its
    cache keeps, the image's compressed bytes). For the disk goal on real content
    (:mod:`bench.goals`)."""
    root = cache_root()
    image = pylib_image(root)
    home = root / f"pyxislevels-store-{os.getpid()}"
    try:
        with running_registry(root / "registry" / "storage") as registry:
            uri = push_v2s2(image, registry.host)
            timed([*importer_argv(), "get", uri], importer_env(home))
            kept = store_bytes(home / "cache")
    finally:
        remove_tree(home)
    return kept, compressed_bytes(image)


def runners(uri: str, enroot: Path, work: Path, compressions: list[str]
            ) -> dict[str, Any]:
    def fresh(name: str) -> Path:
        path = work / name
        remove_tree(path)
        path.mkdir(parents=True)
        return path

    def run_enroot() -> Measured:
        home = fresh("enroot")
        (home / "out").mkdir()
        seconds, cpu, _ = timed(["enroot", "import", "-o", str(home / "out" / "i.sqsh"), uri],
                                enroot_env(enroot, home))
        remove_tree(home)
        return Measured(seconds, cpu)

    def run_get(compression: str, squashfs_only: bool) -> Measured:
        home = fresh("importer")
        extra = {"OCISTAGE_PYXIS_COMPRESSION": compression}
        if squashfs_only:
            extra["OCISTAGE_PYXIS_SQUASHFS_ONLY"] = "1"
        seconds, cpu, _ = timed([*importer_argv(), "get", uri], importer_env(home, **extra))
        kept = store_bytes(home / "cache")
        remove_tree(home)
        return Measured(seconds, cpu, kept)

    cases: dict[str, Any] = {"enroot": run_enroot}
    for compression in compressions:
        for only in (False, True):
            name = f"{compression}{' sq-only' if only else ''}"
            cases[name] = (lambda c, o: lambda: run_get(c, o))(compression, only)
    return cases


def measure(uri: str, image: BuiltImage, enroot: Path, work: Path, reps: int,
            compressions: list[str]) -> dict[str, Any]:
    cases = runners(uri, enroot, work, compressions)
    samples: dict[str, list[Measured]] = {name: [] for name in cases}
    loads = [os.getloadavg()]
    for rep in range(reps):
        order = list(cases) if rep % 2 == 0 else list(reversed(cases))
        for name in order:
            samples[name].append(cases[name]())
            print(f"  {image.name} {name}: {samples[name][-1].seconds:.2f} s, "
                  f"cpu {samples[name][-1].cpu:.2f} s, load {os.getloadavg()[0]:.1f}",
                  flush=True)
        loads.append(os.getloadavg())
    compressed = compressed_bytes(image)
    medians = {name: {"seconds": statistics.median(s.seconds for s in got),
                      "cpu": statistics.median(s.cpu for s in got),
                      "store_bytes": statistics.median(s.store_bytes for s in got)}
               for name, got in samples.items()}
    return {"image": image.name, "compressed_bytes": compressed, "loads": loads,
            "samples": {n: [vars(s) for s in v] for n, v in samples.items()},
            "medians": medians}


def render(result: dict[str, Any]) -> str:
    medians = result["medians"]
    enroot = medians["enroot"]
    loads = [load[0] for load in result["loads"]]
    lines = [f"{result['image']} ({result['compressed_bytes'] / MB:.1f} MB compressed; load "
             f"{min(loads):.1f}-{max(loads):.1f})",
             f"  {'case':16} {'wall s':>7} {'cpu s':>7} {'get/enroot':>10} {'store/compr':>11}"]
    for name, median in medians.items():
        ratio = median["seconds"] / enroot["seconds"]
        store = median["store_bytes"] / result["compressed_bytes"] if name != "enroot" else 0
        lines.append(f"  {name:16} {median['seconds']:7.2f} {median['cpu']:7.2f} "
                     f"{ratio:10.2f} {store:11.2f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench pyxislevels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per case [3]")
    parser.add_argument("--files", type=int, default=10_000, help="synthetic: files [10000]")
    parser.add_argument("--megabytes", type=int, default=200, help="synthetic: MB [200]")
    parser.add_argument("--compressions", default=",".join(COMPRESSIONS),
                        help=f"OCISTAGE_PYXIS_COMPRESSION values [{','.join(COMPRESSIONS)}]")
    parser.add_argument("--images", default="synthetic,pylib", help="[synthetic,pylib]")
    parser.add_argument("--work", type=Path, help="scratch homes here (e.g. on a tmpfs) "
                        "[the bench cache]")
    args = parser.parse_args(argv)
    enroot = enroot_or_say()
    if enroot is None:
        return 1
    root = cache_root()
    images = []
    if "synthetic" in args.images:
        images.append(build_synthetic(SynthSpec(args.files, args.megabytes * MB),
                                      ("gzip",))["gzip"])
    if "pylib" in args.images and PYLIB.is_dir():
        images.append(pylib_image(root))
    work = (args.work or root) / f"pyxislevels-work-{os.getpid()}"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results = []
    try:
        with running_registry(root / "registry" / "storage") as registry:
            for image in images:
                uri = push_v2s2(image, registry.host)
                results.append(measure(uri, image, enroot, work, max(1, args.reps),
                                       [c for c in args.compressions.split(",") if c]))
                print(render(results[-1]), flush=True)
    finally:
        remove_tree(work)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"pyxislevels-{stamp}.json"
    out.write_text(json.dumps({"when": stamp, "work": str(work), "cpus": os.cpu_count(),
                               "results": results}, indent=2))
    for result in results:
        print(render(result))
    print(f"bench: raw samples in {out}")
    return 0

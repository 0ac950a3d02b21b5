"""``python -m bench pyxis``: ``ocistage-pyxis-importer get`` vs ``enroot import``, side by side.

What pyxis does at the start of a step with ``--container-image``: without an importer it runs
``enroot import`` (pull the layers, unpack them, ``mksquashfs``) into a new squashfs for every
job; with ``importer=ocistage-pyxis-importer`` it runs ``get`` and starts from the squashfs that
prints. Both produce a squashfs of the same image (a synthetic one, :mod:`bench.synthetic`:
``--files`` files of ``--megabytes`` MB in four gzip layers), pushed as Docker v2s2 to a
``docker-registry`` on 127.0.0.1 (enroot 4.1.2 cannot read this registry's OCI manifests,
enroot #277). Cases, in alternating order between repetitions:

- ``enroot cold``      ``enroot import -o FILE docker://REG#IMAGE`` with an empty enroot cache
- ``enroot warm``      the same with the layers in enroot's cache (it still unpacks the
                       layers and runs mksquashfs: enroot makes a new image on every import)
- ``get cold``         ``ocistage-pyxis-importer get`` with an empty cache and store (pull,
                       layer snapshot, mksquashfs)
- ``get warm``         ``get`` again (the default policy ``missing``: no network)
- ``get warm always``  ``get`` again with ``OCISTAGE_PULL=always`` (the registry is asked for
                       the manifest)

The page cache stays warm for every tool (nothing is dropped: the machine is shared). enroot
is found in ``$OCISTAGE_ENROOT_PREFIX`` or ``/opt/ocistage-enroot-pyxis/*/enroot`` (as
``.ci/build-enroot-pyxis.sh`` installs it). Wall time and peak RSS per process (as
:mod:`bench.bundle`); medians and ratios are printed, raw samples written to
``bench/results/pyxis-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bundle import RESULTS, Sample, Workspace, run_alternating, run_timed, running_registry
from bench.images import MB, BuiltImage, cache_root
from bench.synthetic import SynthSpec, build_synthetic
from ocistage.cache.treeremoval import remove_tree

CASES = ("enroot cold", "enroot warm", "get cold", "get warm", "get warm always")


def enroot_bin() -> Path | None:
    """The ``bin/`` of enroot 4.1.2 as CI builds it (or ``$OCISTAGE_ENROOT_PREFIX/bin``)."""
    configured = os.environ.get("OCISTAGE_ENROOT_PREFIX")
    found = [Path(configured)] if configured else [
        Path(p) for p in sorted(glob.glob("/opt/ocistage-enroot-pyxis/*/enroot"))]
    for prefix in found:
        if (prefix / "bin" / "enroot").is_file():
            return prefix / "bin"
    return None


def importer_argv() -> list[str]:
    """The console script pyxis runs, beside this interpreter (else ``python -m``)."""
    beside = Path(sys.executable).parent / "ocistage-pyxis-importer"
    if beside.is_file():
        return [str(beside)]
    return [sys.executable, "-m", "ocistage.bundler.pyxis.main"]


def push_v2s2(image: BuiltImage, registry: str) -> str:
    """The image as Docker v2s2 in the registry; its enroot URI (``docker://REG#REPO:TAG``)."""
    repository = f"bench/{image.name}"
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--format", "v2s2",
                    f"oci:{image.layout}:{image.name}", f"docker://{registry}/{repository}:v2s2"],
                   check=True, stdin=subprocess.DEVNULL)
    return f"docker://{registry}#{repository}:v2s2"


def enroot_env(enroot: Path, home: Path) -> dict[str, str]:
    for sub in ("run", "cache", "data", "config", "tmp"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    return {"PATH": f"{enroot}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
            "ENROOT_RUNTIME_PATH": str(home / "run"), "ENROOT_CACHE_PATH": str(home / "cache"),
            "ENROOT_DATA_PATH": str(home / "data"), "ENROOT_CONFIG_PATH": str(home / "config"),
            "ENROOT_TEMP_PATH": str(home / "tmp"), "ENROOT_ALLOW_HTTP": "y",
            "NO_PROXY": "127.0.0.1,localhost"}


def importer_env(home: Path, **extra: str) -> dict[str, str]:
    """The importer's environment as pyxis gives it: no ENROOT_*, slurmd's PATH, a job id."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OCISTAGE_", "ENROOT_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"HOME": str(home), "OCISTAGE_CACHE": str(home / "cache"),
                "SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "NO_PROXY": "127.0.0.1,localhost",
                **extra})
    return env


def enroot_import(uri: str, enroot: Path, home: Path, output: Path) -> Sample:
    seconds, rss, _ = run_timed(["enroot", "import", "-o", str(output), uri],
                                env=enroot_env(enroot, home))
    return Sample(seconds, rss, {"image_bytes": output.stat().st_size})


def importer_get(uri: str, home: Path, **extra: str) -> Sample:
    seconds, rss, out = run_timed([*importer_argv(), "get", uri], env=importer_env(home, **extra))
    image = Path(out.splitlines()[0])
    return Sample(seconds, rss, {"image_bytes": image.stat().st_size})


def made(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def runners(uri: str, enroot: Path, work: Workspace, warm: Path
            ) -> dict[str, Callable[[], Sample]]:
    """The cases; the warm ones use caches ``warm`` holds (made once, outside ``work``, which
    is emptied after every sample)."""
    return {
        "enroot cold": lambda: enroot_import(uri, enroot, work.fresh("enroot"),
                                             made(work.fresh("out")) / "image.sqsh"),
        "enroot warm": lambda: enroot_import(uri, enroot, warm / "enroot",
                                             made(work.fresh("out")) / "image.sqsh"),
        "get cold": lambda: importer_get(uri, work.fresh("importer")),
        "get warm": lambda: importer_get(uri, warm / "importer"),
        "get warm always": lambda: importer_get(uri, warm / "importer", OCISTAGE_PULL="always"),
    }


def prepare_warm(uri: str, enroot: Path, warm: Path) -> None:
    """One import by each tool into ``warm``: enroot's layer cache, the importer's cache."""
    remove_tree(warm)
    (warm / "out").mkdir(parents=True)
    enroot_import(uri, enroot, warm / "enroot", warm / "out" / "image.sqsh")
    importer_get(uri, warm / "importer")


def _median(samples: list[Sample]) -> dict[str, float]:
    good = [s for s in samples if s.seconds == s.seconds]
    if not good:
        return {"seconds": float("nan"), "max_rss_kib": 0}
    return {"seconds": statistics.median(s.seconds for s in good),
            "max_rss_kib": statistics.median(s.max_rss_kib for s in good)}


def render(result: dict[str, Any]) -> str:
    medians = result["medians"]
    base = medians["enroot cold"]["seconds"]
    lines = [f"{'case':17} {'median s':>9} {'min s':>7} {'max s':>7} {'peak RSS MB':>12} "
             f"{'vs enroot cold':>15}"]
    for name, median in medians.items():
        seconds = [s["seconds"] for s in result["samples"][name]]
        lines.append(f"{name:17} {median['seconds']:9.2f} {min(seconds):7.2f} "
                     f"{max(seconds):7.2f} {median['max_rss_kib'] / 1024:12.1f} "
                     f"{median['seconds'] / base:14.3f}x")
    image = result["image"]
    lines.append(f"({image['entries']} entries, {image['uncompressed'] >> 20} MB files, "
                 f"{image['compressed'] >> 20} MB compressed, {len(image['layers'])} layers)")
    m = {name: value["seconds"] for name, value in medians.items()}
    lines.append(f"get cold / enroot cold {m['get cold'] / m['enroot cold']:.2f}, "
                 f"get warm / enroot warm {m['get warm'] / m['enroot warm']:.3f}, "
                 f"get warm always / enroot warm {m['get warm always'] / m['enroot warm']:.3f}")
    return "\n".join(lines)


def measure(files: int, megabytes: int, reps: int, enroot: Path,
            report: bool = True, work_root: Path | None = None) -> dict[str, Any]:
    """Every case of the module docstring, ``reps`` times, on a synthetic image of ``files``
    files and ``megabytes`` MB; the result document (:func:`render` prints it), with the
    bytes the importer's cache holds after one cold ``get`` (``importer_cache_bytes``).
    ``work_root``: where the cold cases' homes (enroot's and the importer's) are made, e.g. a
    tmpfs for the CPU cost without the disk; by default the bench cache."""
    image = build_synthetic(SynthSpec(files, megabytes * MB), ("gzip",))["gzip"]
    root = cache_root()
    load = os.getloadavg()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with running_registry(root / "registry" / "storage") as registry:
        uri = push_v2s2(image, registry.host)
        work = Workspace((work_root or root) / f"pyxis-work-{os.getpid()}")
        warm = root / f"pyxis-warm-{os.getpid()}"
        try:
            prepare_warm(uri, enroot, warm)
            cache_bytes = disk_bytes(warm / "importer" / "cache")
            samples = run_alternating(image.name, runners(uri, enroot, work, warm),
                                      max(1, reps), work, cold=lambda _name: False,
                                      report=report)
        finally:
            remove_tree(work.root)
            remove_tree(warm)
    return {"when": stamp, "reps": reps, "cpus": os.cpu_count(),
            "load_before": load, "load_after": os.getloadavg(), "page_cache_dropped": False,
            "work": str(work.root),
            "image": {k: v for k, v in asdict(image).items() if k != "layout"},
            "importer_cache_bytes": cache_bytes,
            "samples": {n: [asdict(s) for s in v] for n, v in samples.items()},
            "medians": {n: _median(v) for n, v in samples.items()}}


def disk_bytes(root: Path) -> int:
    """Bytes of disk the files under ``root`` use (``du``'s count: each inode once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top, _dirs, names in os.walk(root):
        for name in names:
            st = os.lstat(os.path.join(top, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def missing_tools() -> list[str]:
    """What this harness needs and the host lacks (enroot: as :func:`enroot_bin` finds it)."""
    missing = [t for t in ("docker-registry", "skopeo", "mksquashfs") if not shutil.which(t)]
    return missing + (["enroot"] if enroot_bin() is None else [])


def enroot_or_say() -> Path | None:
    """enroot (:func:`enroot_bin`) when every tool of :func:`missing_tools` is here; else
    None, after a line on stderr saying what is missing and where enroot comes from."""
    enroot = enroot_bin()
    missing = missing_tools()
    if enroot is None or missing:
        print(f"bench: missing {', '.join(missing)} "
              "(enroot: .ci/build-enroot-pyxis.sh, or $OCISTAGE_ENROOT_PREFIX)", file=sys.stderr)
        return None
    return enroot


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench pyxis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per case [3]")
    parser.add_argument("--files", type=int, default=10_000, help="files in the image [10000]")
    parser.add_argument("--megabytes", type=int, default=200, help="bytes of files, MB [200]")
    args = parser.parse_args(argv)
    enroot = enroot_or_say()
    if enroot is None:
        return 1
    result = measure(args.files, args.megabytes, args.reps, enroot)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"pyxis-{result['when']}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    print(render(result))
    print(f"bench: raw samples in {out}")
    return 0

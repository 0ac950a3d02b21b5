"""``python -m bench bundle``: ocistage vs its peers and the floor, side by side in one run.

For each image the harness runs, alternating the order of the tools between repetitions:

- ``ocistage``       cold ``ocistage bundle REF DEST`` with an empty cache
- ``skopeo+umoci``   ``skopeo copy docker://REF oci:DIR`` then ``umoci unpack --rootless``
- ``ch-image``       ``ch-image pull`` (only when Charliecloud is installed)
- ``podman``         ``podman pull`` (layers unpacked into its overlay storage) + ``podman
                     image mount`` (the rootfs as a mounted tree), with a private storage
                     root, as root (only when Debian's podman is installed)
- ``floor``          per layer ``curl BLOB | tee blob | tee >(sha256sum) | gzip -dc | tee
                     >(sha256sum) | tar -x`` (``zstd -dc --long=31`` for zstd), summed; the
                     blob kept and both digests checked (:mod:`bench.floor`)
- ``floor-nv``       per layer ``curl BLOB | gzip -dc | tar -x``: the floor before issue 29
- ``cold cache``     cold ``ocistage bundle REF`` into the cache (snapshot + hard-linked bundle)
- ``warm``           ``ocistage bundle REF NEWDEST`` again, with the cache of a cold run
- ``warm --link``    the same with ``--link`` (hard links from the snapshot, read-only root);
                     ``make_bundle(link=True)`` in a Python process if the CLI lacks the option
- ``warm cached``    ``ocistage bundle REF`` again into the cache that made it: the bundle a
                     Slurm job names with ``--container=$(ocistage bundle REF)`` is found again
- ``warm --pull missing``  the same with ``--pull missing``: no registry request
- ``podman pull present``  ``podman pull`` of an image its storage already holds (the tag is
                     asked for again)
- ``DEST from snap``  ``bundle REF NEWDEST`` with the image's snapshot cached, ``cp -a`` of
                     a bundle beside it, and ``--version`` (the CLI's start alone)
- ``shared``         (``derived`` only) ``ocistage bundle derived`` with a cache holding
                     ``multi``'s bundle: only the two new layers are fetched and unpacked

Wall time is measured around each process; peak RSS comes from ``wait4`` (the largest process
of the run, pipelines included). Medians and ratios are printed; the raw numbers are written
as JSON to ``bench/results/``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.floor import FloorLayer, run_layers, zstd_window
from bench.images import MB, BuiltImage, build_all, cache_root, push
from bench.synthetic import SynthSpec, build_synthetic
from ocistage.cache.treeremoval import remove_tree

RESULTS = Path(__file__).parent / "results"
COLD_RUNS = frozenset({"ocistage", "skopeo+umoci", "ch-image", "podman", "floor",
                       "floor-nv", "cold cache"})
DEFAULT_IMAGES = ("single", "multi", "derived", "zstd", "big")


@dataclass
class Sample:
    seconds: float
    max_rss_kib: int
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Registry:
    host: str
    process: subprocess.Popen[bytes]


# Runs one command and reports its wall time and wait4's peak RSS through a pipe. A process's
# ru_maxrss includes the RSS of the process it was forked from, as it was at fork/exec: forked
# from this harness (~45 MB of Python) every tool would show at least that. This launcher is a
# Python without site (~7 MB here): that is the floor of every RSS the harness reports.
LAUNCHER = """
import os, sys, time
fd = int(sys.argv[1])
start = time.perf_counter()
try:
    pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
except OSError as exc:
    os.write(2, f"{sys.argv[2]}: {exc}\\n".encode())
    sys.exit(127)
_, status, usage = os.wait4(pid, 0)
os.write(fd, f"{time.perf_counter() - start} {usage.ru_maxrss}".encode())
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def run_timed(argv: list[str], env: dict[str, str] | None = None,
              sync: bool = True) -> tuple[float, int, str]:
    """Run ``argv``; (wall seconds, peak RSS in KiB of the largest process, stdout).

    Dirty data of earlier runs is written back first (``sync``): otherwise its writeback
    competes with this run's file creations (measured: a warm run right after a cold one took
    twice as long as the cold one, every ``open(O_CREAT)`` waiting on the journal). The time
    and the RSS are taken by :data:`LAUNCHER` around the command alone.
    """
    if sync:
        os.sync()
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-I", "-S", "-c", LAUNCHER, str(write_end),
                                    *argv], env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   pass_fds=(write_end,))
        os.close(write_end)
        write_end = -1
        out, err = process.communicate()
        with os.fdopen(read_end, "rb") as report:
            read_end = -1
            measured = report.read().split()
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    if process.returncode != 0 or len(measured) != 2:
        raise RuntimeError(f"{shlex.join(argv)} exited {process.returncode}:\n"
                           f"{err.decode(errors='replace')[-3000:]}")
    return float(measured[0]), int(measured[1]), out.decode()


def drop_kernel_caches() -> bool:
    """Write back and drop the page cache, dentries and inodes, if we are allowed to (root,
    not in a restricted sandbox); whether it was done."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("3\n")
    except OSError:
        return False
    return True


def drop_page_cache() -> bool:
    """:func:`drop_kernel_caches`, then load the tools' own code again: cold runs measure cold
    image data, not cold programs (the Python interpreter and its modules would otherwise pay
    ~1 s that Go binaries do not)."""
    if not drop_kernel_caches():
        return False
    for argv in ([ocistage_script(), "bundle", "--help"], ["skopeo", "--version"],
                 ["umoci", "--version"], ["curl", "--version"], ["tar", "--version"],
                 ["gzip", "--version"], ["zstd", "--version"],
                 [sys.executable, "-c", "import ocistage.bundler.flows.bundle"]):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return True


@contextmanager
def running_registry(storage: Path) -> Iterator[Registry]:
    """A plain-HTTP docker-registry on 127.0.0.1 whose storage persists across runs."""
    import socket

    storage.mkdir(parents=True, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = storage.parent / "registry.yml"
    config.write_text(json.dumps({
        "version": "0.1", "log": {"level": "error", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)},
                    "maintenance": {"uploadpurging": {"enabled": False}}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "ocistage-bench"},
    }))
    log = open(storage.parent / "registry.log", "ab")  # noqa: SIM115 - closed below
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        import urllib.request
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("docker-registry did not start") from None
                time.sleep(0.05)
        yield Registry(f"127.0.0.1:{port}", process)
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


class Workspace:
    """Scratch directories for one bench run, on the same filesystem as the bench cache."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.counter = 0
        remove_tree(root)
        root.mkdir(parents=True)

    def fresh(self, name: str) -> Path:
        self.counter += 1
        return self.root / f"{name}-{self.counter}"

    def clear(self) -> None:
        for child in list(self.root.iterdir()):
            remove_tree(child)


def ocistage_env(cache: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OCISTAGE_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"OCISTAGE_CACHE": str(cache), "HOME": str(home), "NO_COLOR": "1",
                "NO_PROXY": "127.0.0.1,localhost"})
    return env


# `make_bundle(..., link=True)` as a process, for a CLI without `--link` (same work, without
# typer's start-up; the table says which one ran)
LINK_SCRIPT = """
import json, sys
from pathlib import Path
from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.cache.store import Store
result = make_bundle(parse_reference(sys.argv[1]), Store.open(sys.argv[2]), Path(sys.argv[3]),
                     link=True)
print(json.dumps({"path": str(result.path), "layers_applied": result.layers_applied,
                  "image": {"fetched_bytes": result.image.fetched_bytes,
                            "reused_blobs": result.image.reused_blobs}}))
"""


def ocistage_script() -> str:
    """The ``ocistage`` entry point of this interpreter: not a version manager's shim found on
    PATH first (a pyenv shim is a shell script that adds 70-140 ms to every run)."""
    beside = Path(sys.executable).parent / "ocistage"
    if beside.is_file():
        return str(beside)
    return shutil.which("ocistage") or "ocistage"


def cli_has_link() -> bool:
    out = subprocess.run([ocistage_script(), "bundle", "--help"], capture_output=True, text=True,
                         check=False, env={**os.environ, "COLUMNS": "200"}).stdout
    return "--link" in out


def ocistage_bundle(ref: str, dest: Path | None, cache: Path, work: Workspace,
                    link: bool = False, pull: str | None = None) -> Sample:
    """``ocistage bundle`` (into ``dest``, or the cache when None); ``link``: --link mode;
    ``pull``: its ``--pull`` policy (the default, ``always``, when None)."""
    home = work.root / "home"
    home.mkdir(exist_ok=True)
    ocistage = ocistage_script()
    if link and dest is not None and not cli_has_link():
        argv = [sys.executable, "-c", LINK_SCRIPT, ref, str(cache), str(dest)]
    else:
        argv = [ocistage, "bundle", "--json", *(["--link"] if link else []),
                *(["--pull", pull] if pull else []), ref,
                *([str(dest)] if dest is not None else [])]
    seconds, rss, out = run_timed(argv, env=ocistage_env(cache, home))
    report = json.loads(out)
    image = report.get("image", {})
    return Sample(seconds, rss, {"fetched_bytes": image.get("fetched_bytes"),
                                 "reused_blobs": image.get("reused_blobs"),
                                 "layers_applied": report.get("layers_applied")})


def run_ocistage_cold(ref: str, work: Workspace) -> Sample:
    return ocistage_bundle(ref, work.fresh("bundle"), work.fresh("cache"), work)


def run_skopeo_umoci(ref: str, work: Workspace) -> Sample:
    layout = work.fresh("layout")
    bundle = work.fresh("umoci")
    t1, rss1, _ = run_timed(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                             f"docker://{ref}", f"oci:{layout}:image"])
    t2, rss2, _ = run_timed(["umoci", "unpack", "--rootless", "--image", f"{layout}:image",
                             str(bundle)], sync=False)  # one run: no writeback in between
    return Sample(t1 + t2, max(rss1, rss2), {"skopeo": t1, "umoci": t2})


def run_charliecloud(ref: str, work: Workspace) -> Sample:
    storage = work.fresh("ch")
    env = {**os.environ, "CH_IMAGE_STORAGE": str(storage)}
    seconds, rss, _ = run_timed(["ch-image", "pull", "--tls-no-verify", ref], env=env)
    return Sample(seconds, rss)


def podman_usable() -> bool:
    """podman is installed and may mount an image here (``image mount`` needs root)."""
    return shutil.which("podman") is not None and os.geteuid() == 0


def _podman_base(work: Workspace) -> tuple[list[str], Path]:
    """podman's command line with a private storage root (overlay), and its runroot."""
    root = work.fresh("podman")
    runroot = Path(tempfile.mkdtemp(prefix="ocs-pr-", dir="/tmp"))  # podman: <= 50 characters
    return ["podman", "--root", str(root), "--runroot", str(runroot), "--storage-driver",
            "overlay", "--cgroup-manager", "cgroupfs", "--events-backend", "file"], runroot


def _podman_reset(base: list[str], runroot: Path) -> None:
    subprocess.run([*base, "image", "unmount", "--all", "--force"], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([*base, "system", "reset", "--force"], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shutil.rmtree(runroot, ignore_errors=True)


def run_podman(ref: str, work: Workspace) -> Sample:
    """``podman pull`` into a private storage (overlay: each layer unpacked once, as podman
    users get it) + ``podman image mount``: the image's rootfs as a tree. Unmounted and its
    storage removed after the timing."""
    base, runroot = _podman_base(work)
    try:
        t1, rss1, _ = run_timed([*base, "pull", "--quiet", "--tls-verify=false",
                                 f"docker://{ref}"])
        t2, rss2, out = run_timed([*base, "image", "mount", ref], sync=False)
        if not Path(out.strip(), "bin").exists() and not any(Path(out.strip()).iterdir()):
            raise RuntimeError(f"podman image mount gave {out.strip()!r}, an empty tree")
        return Sample(t1 + t2, max(rss1, rss2), {"pull": t1, "mount": t2})
    finally:
        _podman_reset(base, runroot)


def run_podman_present(ref: str, work: Workspace) -> Sample:
    """An untimed ``podman pull``, then ``podman pull`` of the same tag again: the image is
    present, podman asks the registry for the tag's manifest (issue 29.3's yardstick of a
    warm cached bundle with the tag re-resolved)."""
    base, runroot = _podman_base(work)
    pull = [*base, "pull", "--quiet", "--tls-verify=false", f"docker://{ref}"]
    try:
        run_timed(pull)
        seconds, rss, _ = run_timed(pull)
        return Sample(seconds, rss)
    finally:
        _podman_reset(base, runroot)


def run_floor(image: BuiltImage, registry: str, work: Workspace, verify: bool = True) -> Sample:
    """Every layer in order into one directory through the floor's pipeline
    (:mod:`bench.floor`): verifying (blob kept, both digests checked) or, ``verify=False``,
    ``curl | gzip -dc | tar -x`` as before issue 29."""
    layers = [FloorLayer(f"http://{registry}/v2/bench/{image.name}/blobs/{digest}",
                         compression, digest, diff_id)
              for (digest, compression), diff_id in zip(image.layers, image.diff_ids,
                                                        strict=True)]

    def timed(argv: list[str], first: bool) -> tuple[float, int]:
        seconds, rss, _ = run_timed(argv, sync=first)  # the layers as one run
        return seconds, rss

    name = "floor" if verify else "floor-nv"
    seconds, rss = run_layers(layers, work.fresh(name), work.fresh(f"{name}-blobs"), verify,
                              timed)
    return Sample(seconds, rss)


def run_cold_cached(ref: str, work: Workspace) -> Sample:
    """Cold ``ocistage bundle REF`` into the cache (snapshot + linked bundle)."""
    return ocistage_bundle(ref, None, work.fresh("cache"), work)


def run_warm(ref: str, work: Workspace, link: bool = False) -> Sample:
    """A cold bundle (not timed), then a bundle into a new directory with that cache."""
    cache = work.fresh("cache")
    ocistage_bundle(ref, work.fresh("bundle"), cache, work, link)
    return ocistage_bundle(ref, work.fresh("bundle"), cache, work, link)


def run_warm_cached(ref: str, work: Workspace) -> Sample:
    """A cold bundle into the cache (not timed), then the same command again."""
    cache = work.fresh("cache")
    ocistage_bundle(ref, None, cache, work)
    return ocistage_bundle(ref, None, cache, work)


def run_warm_missing(ref: str, work: Workspace) -> Sample:
    """As :func:`run_warm_cached`, with ``--pull missing``: the cached bundle is used as is,
    without asking the registry (goal: at most 2x ``--version``)."""
    cache = work.fresh("cache")
    ocistage_bundle(ref, None, cache, work)
    return ocistage_bundle(ref, None, cache, work, pull="missing")


def run_dest_from_snapshot(ref: str, work: Workspace) -> Sample:
    """An untimed cold ``bundle REF`` (into the cache: the image's snapshot is kept), then a
    writable ``bundle REF NEWDEST``: a copy of that snapshot (goal: at most 1.2x ``cp -a``)."""
    cache = work.fresh("cache")
    ocistage_bundle(ref, None, cache, work)
    return ocistage_bundle(ref, work.fresh("bundle"), cache, work)


def run_cp_a(ref: str, work: Workspace) -> Sample:
    """``cp -a`` of a bundle made by an untimed cold run: what a writable DEST is measured
    against (goal: a warm ``bundle REF NEWDEST`` at most 1.2x this)."""
    bundle = work.fresh("bundle")
    ocistage_bundle(ref, bundle, work.fresh("cache"), work)
    seconds, rss, _ = run_timed(["cp", "-a", str(bundle), str(work.fresh("copy"))])
    return Sample(seconds, rss)


def run_version(work: Workspace) -> Sample:
    """``ocistage --version``: the interpreter's and the CLI's start-up alone (goal: a warm
    cached ``bundle REF`` within 2x of it)."""
    home = work.root / "home"
    home.mkdir(exist_ok=True)
    seconds, rss, _ = run_timed([ocistage_script(), "--version"],
                                env=ocistage_env(work.fresh("cache"), home))
    return Sample(seconds, rss)


def run_link_after_dest(ref: str, work: Workspace) -> Sample:
    """A cold ``bundle REF DEST`` (not timed), then ``bundle --link REF NEWDEST`` with that
    cache: the image is not unpacked again (``layers_applied`` 0)."""
    cache = work.fresh("cache")
    ocistage_bundle(ref, work.fresh("bundle"), cache, work)
    return ocistage_bundle(ref, work.fresh("bundle"), cache, work, link=True)


def run_shared(base_ref: str, derived_ref: str, work: Workspace) -> Sample:
    """Bundle ``base_ref`` into the cache (not timed), then ``derived_ref``, which shares its
    base layers, into the cache too (both through snapshots)."""
    cache = work.fresh("cache")
    ocistage_bundle(base_ref, None, cache, work)
    return ocistage_bundle(derived_ref, None, cache, work)


def _median(samples: list[Sample]) -> Sample:
    ordered = sorted(samples, key=lambda s: s.seconds)
    middle = ordered[len(ordered) // 2]
    return Sample(statistics.median(s.seconds for s in samples),
                  max(s.max_rss_kib for s in samples), middle.detail)


def run_alternating(label: str, runners: dict[str, Callable[[], Sample]], reps: int,
                    work: Workspace, cold: Callable[[str], bool],
                    report: bool = False) -> dict[str, list[Sample]]:
    """Run every runner ``reps`` times, alternating the order between repetitions (A B C,
    then C B A); the page cache is dropped before a run ``cold(name)`` says is cold; a
    failure is a NaN sample with its message; ``report``: a line per sample as it comes."""
    samples: dict[str, list[Sample]] = {name: [] for name in runners}
    for rep in range(reps):
        order = list(runners) if rep % 2 == 0 else list(reversed(runners))
        for name in order:
            if cold(name):
                drop_page_cache()
            try:
                samples[name].append(runners[name]())
            except RuntimeError as exc:
                print(f"bench: {label}/{name} failed: {exc}", flush=True)
                samples[name].append(Sample(float("nan"), 0, {"error": str(exc)[:500]}))
            finally:
                work.clear()
            if report:
                print(f"  {label} {name}: {samples[name][-1].seconds:.2f} s, "
                      f"{samples[name][-1].max_rss_kib / 1024:.0f} MB", flush=True)
    return samples


def bench_image(image: BuiltImage, registry: str, reps: int, work: Workspace,
                can_drop: bool, all_images: dict[str, str],
                only: frozenset[str] | None = None) -> dict[str, Any]:
    ref = all_images[image.name]
    runners: dict[str, Callable[[], Sample]] = {
        "ocistage": lambda: run_ocistage_cold(ref, work),
        "skopeo+umoci": lambda: run_skopeo_umoci(ref, work),
        "floor": lambda: run_floor(image, registry, work),
        "floor-nv": lambda: run_floor(image, registry, work, verify=False),
    }
    if shutil.which("ch-image"):
        runners["ch-image"] = lambda: run_charliecloud(ref, work)
    if podman_usable():
        runners["podman"] = lambda: run_podman(ref, work)
    runners["cold cache"] = lambda: run_cold_cached(ref, work)
    runners["warm"] = lambda: run_warm(ref, work)
    runners["warm --link"] = lambda: run_warm(ref, work, link=True)
    runners["warm cached"] = lambda: run_warm_cached(ref, work)
    runners["warm --pull missing"] = lambda: run_warm_missing(ref, work)
    if podman_usable():
        runners["podman pull present"] = lambda: run_podman_present(ref, work)
    runners["DEST from snap"] = lambda: run_dest_from_snapshot(ref, work)
    runners["link after DEST"] = lambda: run_link_after_dest(ref, work)
    runners["cp -a"] = lambda: run_cp_a(ref, work)
    runners["--version"] = lambda: run_version(work)
    if image.name == "derived" and "multi" in all_images:
        runners["shared"] = lambda: run_shared(all_images["multi"], ref, work)
    if only is not None:
        runners = {name: run for name, run in runners.items() if name in only}
    samples = run_alternating(image.name, runners, reps, work,
                              cold=lambda name: can_drop and name in COLD_RUNS)
    medians = {name: _median(values) for name, values in samples.items()}
    windows = [zstd_window(image.layout / "blobs" / "sha256" / digest.split(":", 1)[1])
               for digest, compression in image.layers if compression == "zstd"]
    return {"image": {**{k: v for k, v in asdict(image).items() if k != "layout"},
                      "zstd_window": max(windows, default=0)},
            "samples": {name: [asdict(s) for s in values] for name, values in samples.items()},
            "medians": {name: asdict(s) for name, s in medians.items()}}


# (numerator, denominator, goal, "<=" or ">="): the ratios of issue 29 a run can show
GOALS = (
    ("ocistage", "floor", 1.0, "<="),
    ("ocistage", "floor-nv", None, ""),
    ("skopeo+umoci", "ocistage", 3.0, ">="),
    ("podman", "ocistage", 1.5, ">="),
    ("DEST from snap", "cp -a", 1.2, "<="),
    ("warm --pull missing", "--version", 2.0, "<="),
    ("warm cached", "--version", 3.0, "<="),
    ("warm cached", "podman pull present", None, ""),
    ("warm --link", "ocistage", None, ""),
)


def goal_lines(result: dict[str, Any]) -> list[str]:
    """One line per ratio of :data:`GOALS` whose two runs are in ``result``, with its verdict;
    then the peak RSS of the cold bundle against the memory goal (issue 29.5)."""
    m = result["medians"]
    lines = []
    for top, bottom, goal, sense in GOALS:
        if top not in m or bottom not in m or not m[bottom]["seconds"]:
            continue
        ratio = m[top]["seconds"] / m[bottom]["seconds"]
        verdict = ""
        if math.isnan(ratio):  # every run of a tool failed (umoci cannot unpack zstd)
            verdict = " (no successful run)"
        elif goal is not None:
            met = ratio <= goal if sense == "<=" else ratio >= goal
            verdict = f" (goal {sense} {goal:g}) {'met' if met else 'MISSED'}"
        lines.append(f"{top} / {bottom} {ratio:.3f}{verdict}")
    if "ocistage" in m:
        rss = m["ocistage"]["max_rss_kib"] / 1024
        kinds = {c for _, c in result["image"]["layers"]}
        if kinds == {"gzip"}:
            lines.append(f"cold peak RSS {rss:.0f} MB (goal < 150 MB) "
                         f"{'met' if rss < 150 else 'MISSED'}")
        else:
            goal = result["image"].get("zstd_window", 0) / MB + 100
            lines.append(f"cold peak RSS {rss:.0f} MB (goal <= the zstd window + 100 MB: "
                         f"{goal:.0f} MB) {'met' if rss <= goal else 'MISSED'}")
    if "link after DEST" in m:
        applied = m["link after DEST"]["detail"].get("layers_applied")
        # 0 where the writable DEST's copy could be a reflink; elsewhere a cold DEST is
        # unpacked in place, keeping no snapshot, by choice (docs/history/performance-log.md,
        # "Writable DEST"): the --link bundle after it unpacks again
        lines.append(f"link after DEST: layers unpacked again {applied} (0 where DEST's "
                     "copy is a reflink; elsewhere no snapshot is kept, by choice)")
    return lines


def render(results: list[dict[str, Any]]) -> str:
    lines = []
    header = (f"{'image':9} {'tool':20} {'median s':>9} {'peak RSS MB':>12} "
              f"{'vs ocistage':>12}")
    lines.append(header)
    lines.append("-" * len(header))
    for result in results:
        medians = result["medians"]
        cold = medians.get("ocistage", {}).get("seconds", float("nan"))
        for name, median in medians.items():
            seconds = median["seconds"]
            ratio = seconds / cold if cold else float("nan")
            lines.append(f"{result['image']['name']:9} {name:20} {seconds:9.2f} "
                         f"{median['max_rss_kib'] / 1024:12.1f} {ratio:11.2f}x")
        info = result["image"]
        lines.append(f"{'':9} ({info['entries']} entries, {info['uncompressed'] >> 20} MB "
                     f"files, {info['compressed'] >> 20} MB compressed, "
                     f"{len(info['layers'])} layers)")
    lines.append("")
    lines.append("goals of issue 29 (ratios of medians in this run):")
    for result in results:
        for line in goal_lines(result):
            lines.append(f"{result['image']['name']:9} {line}")
    return "\n".join(lines)


def load_images(names: list[str]) -> dict[str, BuiltImage]:
    """The bench images of :data:`bench.images.SPECS` and the synthetic ones named
    ``scale-<files>f-<MB>m-<gzip|zstd>`` (:func:`synthetic_spec`), built once and cached."""
    plain = [name for name in names if synthetic_spec(name) is None]
    images = build_all(plain) if plain else {}
    for name in names:
        parsed = synthetic_spec(name)
        if parsed is not None:
            spec, compression = parsed
            images[name] = build_synthetic(spec, (compression,))[compression]
    return images


def synthetic_spec(name: str) -> tuple[SynthSpec, str] | None:
    """``scale-30000f-1024m-gzip`` -> (30k files of 1024 MB in all, gzip); None otherwise."""
    match = re.fullmatch(r"scale-(\d+)f-(\d+)m-(gzip|zstd)", name)
    if match is None:
        return None
    return SynthSpec(int(match[1]), int(match[2]) * MB), match[3]


def main(names: list[str], reps: int, drop: bool = True,
         only: frozenset[str] | None = None) -> int:
    for tool in ("docker-registry", "skopeo", "umoci", "curl", "tar", "gzip", "zstd",
                 "ocistage"):
        if shutil.which(tool) is None:
            print(f"bench: {tool} is not installed (see `make deps`)")
            return 1
    wanted = list(dict.fromkeys([*names, *(["multi"] if "derived" in names else [])]))
    images = load_images(wanted)
    root = cache_root()
    can_drop = drop and drop_page_cache()
    print("bench: page cache " + ("dropped before every cold run" if can_drop else
                                  "kept: every tool runs with a warm page cache"),
          flush=True)
    results: list[dict[str, Any]] = []
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"bundle-{stamp}.json"

    def save() -> None:  # after every image, so a long run's results survive an interruption
        out.write_text(json.dumps({"when": stamp, "page_cache_dropped": can_drop,
                                   "reps": reps, "cpus": os.cpu_count(),
                                   "cache": str(root), "load": os.getloadavg(),
                                   "results": results},
                                  indent=2, default=str))

    with running_registry(root / "registry" / "storage") as registry:
        refs = {name: push(image, registry.host) for name, image in images.items()}
        work = Workspace(root / f"work-{os.getpid()}")
        try:
            for name in names:
                print(f"bench: {name} ({reps} repetitions)", flush=True)
                results.append(bench_image(images[name], registry.host, reps, work, can_drop,
                                           refs, only))
                save()
                print(render(results[-1:]), flush=True)
        finally:
            remove_tree(work.root)
    print(render(results))
    print(f"bench: raw results in {out}")
    return 0

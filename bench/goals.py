"""``python -m bench goals [--quick]`` (the default of ``python -m bench``): every goal of
DESIGN.md's Performance section this machine can measure, run quietly, in one table.

Each goal is a ratio of medians of tools run side by side in one run (alternating order),
measured by the harness that owns it:

- cold bundle vs the verifying floor, skopeo+umoci and podman; warm ``bundle --pull missing``
  and ``bundle`` (tag re-resolved) vs ``ocistage --version``; peak RSS of the cold bundle
  (:mod:`bench.bundle`, the bench image ``single`` and ``zstd``; ``--quick``: a synthetic
  1k-file, 20 MB image);
- a writable DEST from the cached snapshot vs ``cp -a``, on the bench cache's filesystem and on
  tmpfs (:mod:`bench.bundle`, the synthetic
  1 GB / 30k-file image; ``--quick``: the quick image);
- re-stages of a 100k-file tree on tmpfs (:mod:`bench.stage`; ``--quick``: 10k files):
  unchanged vs ``rsync -a``, 1% changed vs ``cp -al`` and vs ``cp -al`` + ``rm -rf``;
  metadata changes vs ``rsync --link-dest`` + removing the old tree (:mod:`bench.metaops`);
- a staged squashfs read through squashfuse_ll vs the kernel's squashfs, by one reader (tar)
  and by one reader per CPU (:mod:`bench.mounts`, five reads each: a single reader's time
  depends on where the scheduler puts it and the FUSE server; root only);
- ``ocistage-pyxis-importer get`` cold vs ``enroot import`` (both tools' homes on this disk, on
  a fresh journaled ext4 loop-mounted from it (root only; :mod:`bench.filesystems` says why
  both) and on a tmpfs), warm vs ``ocistage --version``,
  the importer's cache vs the image's compressed size (:mod:`bench.pyxis`; where enroot is
  installed as ``.ci/build-enroot-pyxis.sh`` installs it).

What needs the root Slurm clusters (several nodes at once, one fetch per blob per job) is
listed as not measurable here. Progress goes to stderr; the table to stdout; the raw results
to ``bench/results/goals-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
MB = 1 << 20
#: the tmpfs where goals compare CPU cost without the disk (DESIGN.md: report both)
TMPFS = Path("/dev/shm")


@dataclass(frozen=True)
class Goal:
    """One goal of DESIGN.md: ``measured`` (a ratio, or MB for memory) against ``limit`` in the
    sense ``sense`` (``<=`` or ``>=``); ``why_not``: why it was not measured here."""

    name: str
    limit: float
    sense: str = "<="
    measured: float | None = None
    detail: str = ""
    why_not: str = ""
    unit: str = "x"

    @property
    def target(self) -> str:
        return f"{self.sense} {self.limit:g}{self.unit}" if self.unit == "x" else \
            f"{self.sense} {self.limit:g} {self.unit}"

    @property
    def verdict(self) -> str:
        if self.why_not:
            return f"not measurable here: {self.why_not}"
        if self.measured is None or math.isnan(self.measured):
            return "failed: no successful run" + (f" ({self.detail})" if self.detail else "")
        met = {"<=": self.measured <= self.limit, "<": self.measured < self.limit,
               ">=": self.measured >= self.limit, ">": self.measured > self.limit}[self.sense]
        return "met" if met else "missed"

    @property
    def shown(self) -> str:
        if self.why_not or self.measured is None or math.isnan(self.measured):
            return "-"
        return f"{self.measured:.3f}{self.unit}" if self.unit == "x" else \
            f"{self.measured:.0f} {self.unit}"


def not_measured(name: str, limit: float, why: str, sense: str = "<=",
                 unit: str = "x") -> Goal:
    return Goal(name, limit, sense, why_not=why, unit=unit)


def ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None or not bottom or math.isnan(top) or math.isnan(bottom):
        return None
    return top / bottom


def render(goals: list[Goal], header: str = "") -> str:
    """The table: goal, measured, target, verdict (and what the ratio is of)."""
    rows = [("goal", "measured", "target", "verdict")]
    rows += [(g.name, g.shown, g.target, g.verdict) for g in goals]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [header] if header else []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3]))
                     + "  " + row[3])
        if n == 0:
            lines.append("-" * (sum(widths) + 6 + len("verdict")))
    details = [f"  {g.name}: {g.detail}" for g in goals if g.detail and not g.why_not]
    if details:
        lines += ["", "what each ratio is of (medians, s):", *details]
    return "\n".join(lines)


# -- measuring, quietly ---------------------------------------------------------------------------

@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The harnesses' own progress lines and tables go to a buffer, not to the terminal."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def say(text: str) -> None:
    print(f"bench goals: {text} ({time.strftime('%H:%M:%S')}, load "
          f"{os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _seconds(medians: dict[str, Any], name: str) -> float | None:
    value = medians.get(name, {}).get("seconds")
    return None if value is None else float(value)


def bundle_goals(image_name: str, zstd_name: str | None, dest_image: str, reps: int,
                 raw: dict[str, Any]) -> list[Goal]:
    from bench import bundle as b
    from bench.images import cache_root, push
    from ocistage.cache.treeremoval import remove_tree

    runs = {"ocistage", "skopeo+umoci", "floor", "podman", "warm cached",
            "warm --pull missing", "--version"}
    images = b.load_images(list(dict.fromkeys([image_name, dest_image,
                                               *([zstd_name] if zstd_name else [])])))
    root = cache_root()
    can_drop = b.drop_page_cache()
    with b.running_registry(root / "registry" / "storage") as registry:
        refs = {name: push(image, registry.host) for name, image in images.items()}
        work = b.Workspace(root / f"goals-work-{os.getpid()}")
        try:
            say(f"bundle {image_name}: cold, warm, peers ({reps} repetitions)")
            main = b.bench_image(images[image_name], registry.host, reps, work, can_drop, refs,
                                 frozenset(runs))
            say(f"bundle {dest_image}: writable DEST vs cp -a (ext4, then tmpfs)")
            dest = b.bench_image(images[dest_image], registry.host, reps, work, can_drop, refs,
                                 frozenset({"DEST from snap", "cp -a"}))
            shm = b.Workspace(Path("/dev/shm") / f"ocistage-goals-{os.getpid()}")
            try:  # DESIGN.md: this machine's ext4 is disk-bound; compare on tmpfs too
                dest_tmpfs = b.bench_image(images[dest_image], registry.host, reps, shm,
                                           can_drop, refs, frozenset({"DEST from snap", "cp -a"}))
            finally:
                remove_tree(shm.root)
            zstd = None
            if zstd_name:
                say(f"bundle {zstd_name}: peak RSS of a cold bundle")
                zstd = b.bench_image(images[zstd_name], registry.host, 1, work, can_drop, refs,
                                     frozenset({"ocistage"}))
        finally:
            remove_tree(work.root)
    raw["bundle"] = {"page_cache_dropped": can_drop, "main": main, "dest": dest,
                     "dest_tmpfs": dest_tmpfs, "zstd": zstd}
    m = main["medians"]
    info = main["image"]
    small = info["uncompressed"] < 300 * MB and info["entries"] < 10_000
    cold = _seconds(m, "ocistage")
    where = "page cache dropped before cold runs" if can_drop else "page cache warm"
    goals = [
        Goal(f"cold bundle / verifying floor ({image_name})", 1.0, "<=",
             ratio(cold, _seconds(m, "floor")),
             f"{_s(cold)} / {_s(_seconds(m, 'floor'))} ({where})"),
        Goal(f"skopeo+umoci / cold bundle ({image_name})", 2.0 if small else 3.0, ">=",
             ratio(_seconds(m, "skopeo+umoci"), cold),
             f"{_s(_seconds(m, 'skopeo+umoci'))} / {_s(cold)}"),
    ]
    if "podman" in m:
        goals.append(Goal(f"podman / cold bundle ({image_name})", 1.5, ">=",
                          ratio(_seconds(m, "podman"), cold),
                          f"{_s(_seconds(m, 'podman'))} / {_s(cold)}"))
    else:
        goals.append(not_measured("podman / cold bundle", 1.5, "podman missing or not root",
                                  ">="))
    version = _seconds(m, "--version")
    goals += [
        Goal("warm bundle --pull missing / --version", 2.0, "<=",
             ratio(_seconds(m, "warm --pull missing"), version),
             f"{_s(_seconds(m, 'warm --pull missing'))} / {_s(version)}"),
        Goal("warm bundle, tag re-resolved / --version", 3.0, "<=",
             ratio(_seconds(m, "warm cached"), version),
             f"{_s(_seconds(m, 'warm cached'))} / {_s(version)}"),
    ]
    for where_, result in (("ext4", dest), ("tmpfs", dest_tmpfs)):
        d = result["medians"]
        goals.append(Goal(f"writable DEST from snapshot / cp -a ({dest_image}, {where_})", 1.2,
                          "<=", ratio(_seconds(d, "DEST from snap"), _seconds(d, "cp -a")),
                          f"{_s(_seconds(d, 'DEST from snap'))} / {_s(_seconds(d, 'cp -a'))}"))
    rss = m.get("ocistage", {}).get("max_rss_kib")
    goals.append(Goal(f"peak RSS, cold bundle, gzip ({image_name})", 150, "<",
                      None if rss is None else rss / 1024, unit="MB"))
    if zstd is not None:
        window = zstd["image"].get("zstd_window", 0) / MB
        zrss = zstd["medians"].get("ocistage", {}).get("max_rss_kib")
        goals.append(Goal(f"peak RSS, cold bundle, zstd ({zstd_name}; window {window:.0f} MB)",
                          window + 100, "<=", None if zrss is None else zrss / 1024,
                          unit="MB"))
    return goals


def stage_goals(files: int, megabytes: int, reps: int, raw: dict[str, Any]) -> list[Goal]:
    from bench import stage as s
    from bench.images import cache_root
    from ocistage.cache.treeremoval import remove_tree

    if shutil.which("rsync") is None:
        why = "rsync is not installed"
        return [not_measured(name, limit, why) for name, limit in (
            ("re-stage unchanged / rsync -a", 1.0), ("re-stage 1% changed / cp -al", 1.3),
            ("re-stage 1% changed / cp -al + rm -rf", 1.5))]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tree = s.make_synthetic(root, files, megabytes * MB)
    target = Path("/dev/shm") / f"ocistage-goals-stage-{os.getpid()}"
    work = root / f"goals-stage-{os.getpid()}"
    try:
        target.mkdir()
        changeable = work / "changeable"
        work.mkdir()
        subprocess.run(["cp", "-a", str(tree), str(changeable)], check=True)
        say(f"stage: {files} files on tmpfs ({reps} repetitions)")
        samples = s.run_case(changeable, target, work / "cache", reps, changeable)
    finally:
        remove_tree(target)
        remove_tree(work)
    med = {case: {tool: statistics.median(v) for tool, v in tools.items()}
           for case, tools in samples.items()}
    raw["stage"] = {"files": files, "samples": samples}
    unchanged, changed = med["nochange"], med["changed"]
    return [
        Goal(f"re-stage unchanged / rsync -a ({files // 1000}k files, tmpfs)", 1.0, "<=",
             ratio(unchanged["cli"], unchanged["rsync"]),
             f"{unchanged['cli']:.3f} / {unchanged['rsync']:.3f}"),
        Goal(f"re-stage 1% changed, returns / cp -al ({files // 1000}k files)", 1.3, "<=",
             ratio(changed["cli"], changed["cpal"]),
             f"{changed['cli']:.3f} / {changed['cpal']:.3f}"),
        Goal(f"re-stage 1% changed, whole work / cp -al + rm -rf ({files // 1000}k)", 1.5,
             "<=", ratio(changed["cli_whole"], changed["linkfarm"]),
             f"{changed['cli_whole']:.3f} / {changed['linkfarm']:.3f} (until the detached "
             "remover has removed the replaced version)"),
    ]


def metaops_goal(files: int, raw: dict[str, Any]) -> Goal:
    from bench.bundle import ocistage_script
    from bench.metaops import measure

    name = f"metadata changes, 1% re-stage / --link-dest + rm ({files // 1000}k files)"
    if shutil.which("strace") is None or shutil.which("rsync") is None:
        return not_measured(name, 1.0, "strace or rsync is not installed")
    say(f"metaops: {files} files, strace -c")
    rows, changed = measure(files, Path("/dev/shm"), ocistage_script())
    raw["metaops"] = {"files": files, "changed": changed, "rows": rows}
    ours = rows["ocistage"]["metadata changes"]
    peer = rows["rsync --link-dest + rm OLD"]["metadata changes"]
    return Goal(name, 1.0, "<=", ratio(ours, peer), f"{ours} / {peer} system calls")


def mounts_goals(image: str, reps: int, raw: dict[str, Any]) -> list[Goal]:
    """G8 by each reader of :mod:`bench.mounts`: one (tar) and one per CPU."""
    from bench.mounts import READERS, sample_name

    name = "squashfs read, squashfuse_ll / kernel"
    names = [f"{name}, {reader} reader{'s' if reader == 'parallel' else ''}"
             for reader in READERS]
    if os.geteuid() != 0:
        return [not_measured(each, 1.6, "the kernel's squashfs needs root to mount")
                for each in names]
    if shutil.which("squashfuse_ll") is None or shutil.which("mksquashfs") is None:
        return [not_measured(each, 1.6, "squashfuse_ll or mksquashfs is not installed")
                for each in names]
    from bench.mounts import measure

    say(f"mounts: staged squashfs of {image}, {reps} reads per mount and reader")
    try:
        result = measure(image, reps, report=False)
    except Exception as exc:  # a host that cannot loop-mount says so
        return [not_measured(each, 1.6, f"mounting failed here ({str(exc)[:80]})")
                for each in names]
    raw["mounts"] = result
    summary = result["summary"]
    goals = []
    for each, reader in zip(names, READERS, strict=True):
        fuse = summary.get(sample_name("squashfuse_ll", reader), {})
        kernel = summary.get(sample_name("kernel", reader), {}).get("median")
        goals.append(Goal(f"{each} ({image})", 1.6, "<=", ratio(fuse.get("median"), kernel),
                          f"{_s(fuse.get('median'))} / {_s(kernel)} s (squashfuse_ll "
                          f"{_s(fuse.get('min'))}-{_s(fuse.get('max'))} s, "
                          f"{fuse.get('server_waits', 0):.0f} server waits)"))
    return goals


def pyxis_goals(files: int, megabytes: int, reps: int, raw: dict[str, Any]) -> list[Goal]:
    from bench import pyxis as p
    from bench.bundle import Workspace, run_version
    from bench.filesystems import describe
    from bench.images import cache_root

    names = (("importer cold get / enroot import", 0.5, "x"),
             ("importer cold get / enroot import, journaled ext4", 0.5, "x"),
             ("importer cold get / enroot import, tmpfs", 0.5, "x"),
             ("importer warm get / --version", 2.0, "x"),
             ("importer cache / compressed image", 2.0, "x"),
             ("importer cache / compressed image, Debian's Python library", 2.0, "x"))
    enroot = p.enroot_bin()
    missing = p.missing_tools()
    if enroot is None or missing:
        why = f"{', '.join(missing)} missing (.ci/build-enroot-pyxis.sh)"
        return [not_measured(name, limit, why) for name, limit, _ in names]
    say(f"pyxis: importer vs enroot, {files} files / {megabytes} MB ({reps} repetitions)")
    result = p.measure(files, megabytes, reps, enroot, report=False)
    on_ext4 = journaled_ext4_measure(files, megabytes, reps, enroot)
    say(f"pyxis: the same on tmpfs ({TMPFS}: the CPU cost without the disk)")
    on_tmpfs = p.measure(files, megabytes, reps, enroot, report=False, work_root=TMPFS)
    work = Workspace(cache_root() / f"goals-version-{os.getpid()}")
    try:
        version = statistics.median(run_version(work).seconds for _ in range(max(3, reps)))
    finally:
        from ocistage.cache.treeremoval import remove_tree

        remove_tree(work.root)
    from bench.pyxislevels import pylib_store

    pylib_kept, pylib_compressed = pylib_store()
    raw["pyxis"] = {**result, "version_s": version, "tmpfs": on_tmpfs,
                    "journaled_ext4": on_ext4,
                    "pylib": {"kept": pylib_kept, "compressed": pylib_compressed}}
    m = {name: value["seconds"] for name, value in result["medians"].items()}
    t = {name: value["seconds"] for name, value in on_tmpfs["medians"].items()}
    compressed = result["image"]["compressed"]
    stored = result["importer_cache_bytes"]
    tag = f"({files // 1000}k files, {megabytes} MB)"
    if isinstance(on_ext4, str):
        journaled = not_measured(f"{names[1][0]} {tag}", 0.5, on_ext4)
    else:
        j = {name: value["seconds"] for name, value in on_ext4["medians"].items()}
        journaled = Goal(f"{names[1][0]} {tag}", 0.5, "<=",
                         ratio(j["get cold"], j["enroot cold"]),
                         f"{j['get cold']:.2f} / {j['enroot cold']:.2f} (mkfs.ext4's "
                         "defaults, loop-mounted from this disk)")
    return [
        Goal(f"{names[0][0]} {tag}", 0.5, "<=", ratio(m["get cold"], m["enroot cold"]),
             f"{m['get cold']:.2f} / {m['enroot cold']:.2f} ({describe(cache_root())})"),
        journaled,
        Goal(f"{names[2][0]} {tag}", 0.5, "<=", ratio(t["get cold"], t["enroot cold"]),
             f"{t['get cold']:.2f} / {t['enroot cold']:.2f} (both tools' homes on {TMPFS})"),
        Goal(names[3][0], 2.0, "<=", ratio(m["get warm"], version),
             f"{m['get warm']:.3f} / {version:.3f}"),
        Goal(f"{names[4][0]} {tag}", 2.0, "<=", ratio(stored, compressed),
             f"{stored / MB:.0f} MB / {compressed / MB:.0f} MB (blobs and squashfs; random "
             "data)"),
        Goal(names[5][0], 2.0, "<=", ratio(pylib_kept, pylib_compressed),
             f"{pylib_kept / MB:.1f} MB / {pylib_compressed / MB:.1f} MB (real content)"),
    ]


def journaled_ext4_measure(files: int, megabytes: int, reps: int,
                           enroot: Path) -> dict[str, Any] | str:
    """:func:`bench.pyxis.measure` with both tools' homes on a fresh journaled ext4
    (:func:`bench.filesystems.journaled_ext4`, under the bench cache); why not, if it cannot
    be made here."""
    from bench import pyxis as p
    from bench.filesystems import NoFilesystem, journaled_ext4
    from bench.images import cache_root

    try:
        with journaled_ext4(cache_root()) as ext4:
            say(f"pyxis: the same on a journaled ext4 ({ext4}, mkfs.ext4's defaults)")
            return p.measure(files, megabytes, reps, enroot, report=False, work_root=ext4)
    except NoFilesystem as exc:
        return str(exc)


CLUSTER_ONLY = (
    ("importer: three nodes at once / one alone", 1.3,
     "needs the root Slurm clusters (python -m bench slurm)"),
    ("cluster: manifest requests and fetches per blob per job", 1.0,
     "needs the root Slurm clusters (tests/e2e)"),
)


@dataclass(frozen=True)
class Sizes:
    image: str
    zstd_image: str | None
    dest_image: str
    reps: int
    stage_files: int
    stage_mb: int
    metaops_files: int
    mounts_image: str
    mounts_reps: int
    pyxis_files: int
    pyxis_mb: int
    pyxis_reps: int


FULL = Sizes("single", "zstd", "scale-30000f-1024m-gzip", 3, 100_000, 300, 100_000, "single",
             5, 10_000, 200, 3)
QUICK = Sizes("scale-1000f-20m-gzip", None, "scale-1000f-20m-gzip", 1, 10_000, 30, 10_000,
              "single", 1, 1_000, 20, 1)


def run(sizes: Sizes, raw: dict[str, Any]) -> list[Goal]:
    """Every goal, each harness quiet; a harness that fails leaves its goals failed with why."""
    goals: list[Goal] = []
    steps: list[tuple[str, Callable[[], list[Goal]]]] = [
        ("bundle", lambda: bundle_goals(sizes.image, sizes.zstd_image, sizes.dest_image,
                                        sizes.reps, raw)),
        ("stage", lambda: stage_goals(sizes.stage_files, sizes.stage_mb, sizes.reps, raw)),
        ("metaops", lambda: [metaops_goal(sizes.metaops_files, raw)]),
        ("mounts", lambda: mounts_goals(sizes.mounts_image, sizes.mounts_reps, raw)),
        ("pyxis", lambda: pyxis_goals(sizes.pyxis_files, sizes.pyxis_mb, sizes.pyxis_reps,
                                      raw)),
    ]
    for label, step in steps:
        try:
            with quiet():
                goals += step()
        except Exception as exc:  # one harness failing leaves the others' goals
            say(f"{label} failed: {exc}")
            goals.append(Goal(f"{label} (harness)", 0.0, detail=str(exc)[:200]))
    goals += [not_measured(name, limit, why) for name, limit, why in CLUSTER_ONLY]
    return goals


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench goals", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small images and trees, one repetition: a smoke run (~3 min)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    load = os.getloadavg()
    started = time.monotonic()
    raw: dict[str, Any] = {}
    goals = run(sizes, raw)
    header = (f"DESIGN.md performance goals ({'quick' if args.quick else 'full'} run, "
              f"{stamp}, {time.monotonic() - started:.0f} s, {os.cpu_count()} CPUs, load "
              f"{load[0]:.1f} -> {os.getloadavg()[0]:.1f})")
    print(render(goals, header))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"goals-{stamp}.json"
    out.write_text(json.dumps({"when": stamp, "sizes": asdict(sizes), "load_before": load,
                               "load_after": os.getloadavg(),
                               "goals": [{**asdict(g), "verdict": g.verdict} for g in goals],
                               "raw": raw}, indent=2, default=str))
    print(f"bench: raw results in {out}")
    return 0

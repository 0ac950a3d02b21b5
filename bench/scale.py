"""``python -m bench scale``: how cold bundling and first staging grow with files and bytes.

Synthetic images (:mod:`bench.synthetic`, seeded, cached) are pushed to a ``docker-registry`` on
127.0.0.1 and, for each size point, these run with a cold page cache (when it can be dropped)
and an empty store, one tool after the other, in alternating order between repetitions:

- ``ocistage``      cold ``ocistage bundle REF DEST``
- ``floor``         per layer ``curl BLOB | tee blob | tee >(sha256sum) | gzip -dc | tee
                    >(sha256sum) | tar -x`` (``zstd -dc --long=31``), summed: the blob kept
                    and both digests checked, as a cold bundle does (:mod:`bench.floor`)
- ``floor-nv``      per layer ``curl BLOB | gzip -dc | tar -x``: the floor before issue 29
- ``skopeo+umoci``  ``skopeo copy`` then ``umoci unpack --rootless``
- ``podman``        ``podman pull`` + ``podman image mount`` (when podman is installed)
- ``stage``         ``ocistage stage BUNDLE --to /dev/shm/...`` (first stage, CLI process) of
                    a bundle made beforehand, and ``rsync -a`` of the same tree to /dev/shm;
                    one tree on tmpfs at a time, removed right after

Peak RSS is ``wait4``'s ``ru_maxrss`` (the largest process of each command). Size sets:
``--set quick`` (100 MB to 1 GB, 1k to 30k files, a zstd --long=27 point), ``full`` (100 MB to
10 GB, 1k to 300k files, the 10 GB / 300k image in gzip and zstd), ``big`` (only the latter)
and ``1g`` (1 GB in 1k to 300k files, and 1 GB / 30k files in zstd); ``--max-files`` leaves
out the points with more files, ``--min-files`` those with fewer.
Results: ``bench/results/scale-<UTC>.json``; the Markdown table and the PNG plot
(``bench/results/scale-<UTC>.png``, copied to ``bench/scale-<set>.png``; time vs files and time
vs bytes per tool) are made from it, and again from any such JSON with ``--replot FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bundle import (
    RESULTS,
    Sample,
    Workspace,
    drop_page_cache,
    ocistage_env,
    ocistage_script,
    podman_usable,
    run_alternating,
    run_floor,
    run_ocistage_cold,
    run_podman,
    run_skopeo_umoci,
    run_timed,
    running_registry,
)
from bench.images import MB, BuiltImage, cache_root, push
from bench.plotting import pyplot
from bench.stage import touch_one_percent
from bench.synthetic import SynthSpec, build_synthetic
from ocistage.cache.treeremoval import remove_tree

GB = 1024 * MB
TOOLS = ("ocistage", "floor", "floor-nv", "skopeo+umoci", "podman")
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class Point:
    """One image size; ``axes``: which plot(s) it belongs to ("files", "bytes")."""

    files: int
    size: int
    compression: str = "gzip"
    axes: tuple[str, ...] = ("files", "bytes")

    @property
    def spec(self) -> SynthSpec:
        return SynthSpec(self.files, self.size)


def _files_axis(size: int, counts: tuple[int, ...]) -> list[Point]:
    return [Point(count, size, axes=("files",)) for count in counts]


def _bytes_axis(files: int, sizes: tuple[int, ...]) -> list[Point]:
    return [Point(files, size, axes=("bytes",)) for size in sizes]


SETS: dict[str, list[Point]] = {
    "quick": [*_files_axis(100 * MB, (1_000, 10_000, 30_000)),
              *_bytes_axis(10_000, (300 * MB, 1 * GB)),
              Point(10_000, 300 * MB, "zstd", axes=())],
    "full": [*_files_axis(1 * GB, (1_000, 10_000, 100_000, 300_000)),
             *_bytes_axis(30_000, (100 * MB, 1 * GB, 3 * GB)),
             Point(300_000, 10 * GB, axes=("bytes",)),
             Point(300_000, 10 * GB, "zstd", axes=())],
    "big": [Point(300_000, 10 * GB, axes=()), Point(300_000, 10 * GB, "zstd", axes=())],
    "1g": [*_files_axis(1 * GB, (1_000, 10_000, 30_000, 100_000)),
           Point(30_000, 1 * GB, "zstd", axes=()),
           *_files_axis(1 * GB, (300_000,))],
}
# a point of the quick files axis (100 MB, 10k files) is also the start of its bytes axis
SETS["quick"][1] = Point(10_000, 100 * MB, axes=("files", "bytes"))


# the staging runs of a point: (key, label); ocistage stage and rsync -a, each first into an
# empty target, then again unchanged, then after 1% of the bundle's files were rewritten
STAGE_RUNS = (("stage tmpfs", "stage first"), ("rsync tmpfs", "rsync -a first"),
              ("restage tmpfs", "stage unchanged"), ("rsync again tmpfs", "rsync -a unchanged"),
              ("restage 1% tmpfs", "stage 1% changed"), ("rsync 1% tmpfs", "rsync -a 1% changed"))


def _stage(bundle: Path, work: Workspace, name: str) -> dict[str, Sample]:
    """``ocistage stage`` of ``bundle`` onto tmpfs vs ``rsync -a`` into a directory beside it:
    first (empty target), again (nothing changed), and after 1% of the files changed."""
    out: dict[str, Sample] = {}
    target = SHM / f"ocistage-bench-scale-{os.getpid()}"
    home = work.root / "home"
    home.mkdir(exist_ok=True)
    stage = ([ocistage_script(), "stage", str(bundle), "--to", str(target / "to"),
              "--name", name, "-q"], ocistage_env(work.root / "stage-cache", home))
    rsync = (["rsync", "-a", f"{bundle}/", f"{target / 'rsync'}/"], None)
    try:
        remove_tree(target)
        target.mkdir()
        for number, (key, _) in enumerate(STAGE_RUNS):
            if number == 4:
                touch_one_percent(bundle, 0)
            argv, env = stage if key.startswith(("stage", "restage")) else rsync
            seconds, rss, _ = run_timed(argv, env=env)
            out[key] = Sample(seconds, rss)
    finally:
        remove_tree(target)
        remove_tree(work.root / "stage-cache")
    return out


def bench_point(image: BuiltImage, ref: str, registry: str, reps: int, work: Workspace,
                can_drop: bool, stage: bool, tools: set[str]) -> dict[str, list[Sample]]:
    runners = {
        "ocistage": lambda: run_ocistage_cold(ref, work),
        "floor": lambda: run_floor(image, registry, work),
        "floor-nv": lambda: run_floor(image, registry, work, verify=False),
        "skopeo+umoci": lambda: run_skopeo_umoci(ref, work),
    }
    if podman_usable():
        runners["podman"] = lambda: run_podman(ref, work)
    runners = {name: run for name, run in runners.items() if name in tools}
    samples = run_alternating(image.name, runners, reps, work, cold=lambda _: can_drop,
                              report=True)
    if stage and image.uncompressed < _shm_free() // 3:
        bundle = work.fresh("stage-bundle")
        run_ocistage_cold_into(ref, bundle, work)
        for _ in range(reps):
            for name, sample in _stage(bundle, work, "scale").items():
                samples.setdefault(name, []).append(sample)
                print(f"  {image.name} {name}: {sample.seconds:.2f} s, "
                      f"{sample.max_rss_kib / 1024:.0f} MB", flush=True)
        work.clear()
    return samples


def run_ocistage_cold_into(ref: str, dest: Path, work: Workspace) -> None:
    home = work.root / "home"
    home.mkdir(exist_ok=True)
    run_timed([ocistage_script(), "bundle", "-q", ref, str(dest)],
              env=ocistage_env(work.fresh("cache"), home))


def _shm_free() -> int:
    try:
        usage = shutil.disk_usage(SHM)
    except OSError:
        return 0
    return usage.free


def _median(samples: list[dict[str, Any]]) -> dict[str, float]:
    return {"seconds": statistics.median(s["seconds"] for s in samples),
            "max_rss_mb": max(s["max_rss_kib"] for s in samples) / 1024}


STAGE_KEYS = tuple(key for key, _ in STAGE_RUNS)
RATIOS = (("ocistage", "floor"), ("ocistage", "floor-nv"), ("skopeo+umoci", "ocistage"),
          ("podman", "ocistage"), ("stage tmpfs", "rsync tmpfs"),
          ("restage tmpfs", "rsync again tmpfs"), ("restage 1% tmpfs", "rsync 1% tmpfs"))


def render_table(results: dict[str, Any]) -> str:
    """The Markdown table of a results document: one row per point, a column per tool."""
    tools = [t for t in (*TOOLS, *STAGE_KEYS)
             if any(t in p["samples"] for p in results["points"])]
    ratios = [(a, b) for a, b in RATIOS
              if any(a in p["samples"] and b in p["samples"] for p in results["points"])]
    head = ["image", "files", "MB", "entries"] + [f"{t} s (MB)" for t in tools]
    head += [f"{a}/{b}".replace(" tmpfs", "") for a, b in ratios]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    for point in results["points"]:
        medians = {t: _median(v) for t, v in point["samples"].items()}
        row = [point["compression"], str(point["files"]), str(point["size"] // MB),
               str(point["entries"])]
        for tool in tools:
            if tool in medians:
                row.append(f"{medians[tool]['seconds']:.2f} ({medians[tool]['max_rss_mb']:.0f})")
            else:
                row.append("")
        for a, b in ratios:
            if a in medians and b in medians and medians[b]["seconds"]:
                row.append(f"{medians[a]['seconds'] / medians[b]['seconds']:.2f}")
            else:
                row.append("")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _draw(ax: Any, points: list[dict[str, Any]], key: str, tools: tuple[str, ...],
          labels: dict[str, str]) -> None:
    """One line per tool of ``tools`` over ``points`` (x: ``point[key]``), log-log."""
    for tool in tools:
        xs, ys = [], []
        for point in points:
            if tool in point["samples"]:
                value = _median(point["samples"][tool])["seconds"]
                if value == value:  # not NaN
                    xs.append(point[key] / (MB if key == "size" else 1))
                    ys.append(value)
        if xs:
            style = "--" if tool.startswith(("rsync", "floor", "skopeo", "podman")) else "-"
            # staging: a case's ocistage and rsync lines share a colour
            color = (f"C{STAGE_KEYS.index(tool) // 2}" if tool in STAGE_KEYS
                     else f"C{tools.index(tool)}")
            ax.plot(xs, ys, style, marker="o", color=color, label=labels.get(tool, tool))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("seconds (median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _fixed(points: list[dict[str, Any]], axis: str) -> str:
    """What stays fixed along an axis: the size (files axis) or the file count (bytes)."""
    if axis == "files":
        return f"{points[0]['size'] // MB} MB"
    base = points[0]["files"]  # the 10 GB point of the full set has 300k files, not 30k
    odd = [f"{p['size'] // MB} MB: {p['files']}" for p in points if p["files"] != base]
    return f"{base} files" + (f"; {', '.join(odd)}" if odd else "")


def plot(results: dict[str, Any], path: Path) -> bool:
    """Cold bundle vs files and vs bytes (each peer and the floors), and staging onto tmpfs vs
    files (first, unchanged, 1% changed; ocistage stage and rsync -a), log-log; False without
    matplotlib or without an axis to draw."""
    plt = pyplot()
    if plt is None:
        return False
    by_axis = {axis: sorted((p for p in results["points"]
                             if axis in p["axes"] and p["compression"] == "gzip"),
                            key=lambda p: p["files" if axis == "files" else "size"])
               for axis in ("files", "bytes")}
    panels: list[tuple[str, str, tuple[str, ...], str]] = [
        (axis, key, TOOLS, f"cold bundle vs {axis}")
        for axis, key in (("files", "files"), ("bytes", "size")) if by_axis[axis]]
    if any(k in p["samples"] for p in by_axis["files"] for k in STAGE_KEYS):
        panels.append(("files", "files", STAGE_KEYS, "staging onto tmpfs vs files"))
    if not panels:
        return False  # --set big: two points, no axis to draw
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5),
                                squeeze=False)
    labels = dict(STAGE_RUNS)
    for ax, (axis, key, tools, title) in zip(axes[0], panels, strict=True):
        points = by_axis[axis]
        _draw(ax, points, key, tools, labels)
        ax.set_title(f"{title} (gzip, {_fixed(points, axis)})", fontsize=9)
        ax.set_xlabel("files" if key == "files" else "uncompressed MB")
    figure.suptitle(f"ocistage bench scale, {results['date']}, load {results['load']}",
                    fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


def report(results: dict[str, Any], stem: Path) -> None:
    table = render_table(results)
    stem.with_suffix(".md").write_text(
        f"`{results['command']}` ({results['date']}, load {results['load']}, "
        f"{results['machine']})\n\n{table}\n")
    plotted = plot(results, stem.with_suffix(".png"))
    if plotted:  # bench/results/ is not kept in git: the README shows bench/scale-<set>.png
        shutil.copyfile(stem.with_suffix(".png"),
                        Path(__file__).parent / f"scale-{results.get('set', 'quick')}.png")
    print(table)
    print(f"bench: {stem.with_suffix('.json')}, {stem.with_suffix('.md')}"
          + (f", {stem.with_suffix('.png')}" if plotted else ""))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), default="full", help="size set [full]")
    parser.add_argument("--quick", action="store_const", const="quick", dest="set",
                        help="the same as --set quick")
    parser.add_argument("--reps", type=int, default=1, help="repetitions per tool [1]")
    parser.add_argument("--max-files", type=int, metavar="N",
                        help="leave out the set's points with more than N files")
    parser.add_argument("--min-files", type=int, default=0, metavar="N",
                        help="leave out the set's points with fewer than N files")
    parser.add_argument("--no-stage", action="store_true", help="skip stage vs rsync")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated subset of {','.join(TOOLS)}")
    parser.add_argument("--replot", type=Path, metavar="JSON",
                        help="only make the table and the PNG again from a results file")
    args = parser.parse_args(argv)
    if args.replot:
        report(json.loads(args.replot.read_text()), args.replot.with_suffix(""))
        return 0
    points = [p for p in SETS[args.set] if p.files >= args.min_files
              and (args.max_files is None or p.files <= args.max_files)]
    # a TERM (kill PID) ends the run through the finally clauses: registry stopped, tmpfs and
    # scratch trees removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tools = set(args.tools.split(","))
    root = cache_root()
    work = Workspace(root / "scale-work")
    can_drop = drop_page_cache()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results: dict[str, Any] = {
        "command": "python -m bench scale " + " ".join(argv),
        "set": args.set,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "machine": f"{os.cpu_count()} CPUs, page cache {'dropped' if can_drop else 'warm'}",
        "points": [],
    }
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"scale-{stamp}"
    try:
        with running_registry(root / "scale-registry" / "storage") as registry:
            for point in points:
                image = build_synthetic(point.spec, (point.compression,))[point.compression]
                ref = push(image, registry.host)
                print(f"bench: {image.name} ({image.entries} entries, "
                      f"{image.compressed // MB} MB compressed)", flush=True)
                samples = bench_point(image, ref, registry.host, max(1, args.reps), work,
                                      can_drop, not args.no_stage, tools)
                results["points"].append({
                    "files": point.files, "size": point.size, "compression": point.compression,
                    "axes": list(point.axes), "name": image.name, "entries": image.entries,
                    "compressed": image.compressed,
                    "samples": {k: [asdict(s) for s in v] for k, v in samples.items()}})
                stem.with_suffix(".json").write_text(json.dumps(results, indent=2))
    finally:
        remove_tree(work.root)
    results["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2))
    report(results, stem)
    subprocess.run(["df", "-h", str(root)], check=False)
    return 0

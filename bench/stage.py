"""``python -m bench.stage``: ``ocistage stage`` against ``rsync -a`` and ``rsync --link-dest``,
side by side in one run.

Trees (sources):

- ``bundle``     a real bundle made by ``ocistage bundle`` of the bench image ``single``
                 (bench/images.py: ~200 MB, ~10k files from /usr) into a bench cache; it is a
                 cache bundle, so ocistage treats it as sealed (see stagers/directory.py)
- ``bundle-copy`` the same bundle copied outside the cache (``cp -a``): an arbitrary tree,
                 walked and stat-compared on every re-stage
- ``synthetic``  ``--files`` files (default 20k; 100k and 300k for issue 16's big trees) of
                 about ``--megabytes`` in all, made on the spot (cached between runs), sizes
                 from 100 B to 1 MB as in a distribution image

Targets: ``same-fs`` (a directory beside the source: ocistage hardlinks the sealed ``bundle``
and copies the other trees into the target's pool: only cache content shares inodes with a
staged tree) and ``tmpfs`` (``/dev/shm``, another filesystem: ocistage copies into the
target's pool).

Cases, each as the median of ``--reps`` repetitions with the order of the tools alternating
(A/B/C/D, D/C/B/A, ...):

- ``first``     stage into an empty target vs ``rsync -a SRC/ DST/`` into an empty directory
- ``nochange``  the same again, nothing changed
- ``changed``   after rewriting 1% of the files of the source (new content and mtime)

A re-stage (``nochange``, ``changed``) has two peers: ``rsync -a`` in place (torn reads for a
job running meanwhile) and the one with ocistage's atomic contract, ``rsync -a
--link-dest=CUR SRC/ NEW/`` followed by ``rm -rf CUR`` (:class:`LinkDest`; timed alone and as
the sum). Beside them, ``cp -al + rm``: ``cp -al CUR COPY`` then ``rm -rf COPY``, one ``link()``
per file and one ``unlink()`` per entry made by C tools that look at nothing else — what any
re-stage with the atomic contract (a complete new version, the replaced one removed) costs in
system calls before it finds out what changed: the floor of that contract. ``--files`` with
several counts makes a scaling run of the synthetic tree and a plot
(:func:`plot_scaling`, ``bench/restage-scale.png``).

ocistage is measured twice: ``lib`` calls :func:`ocistage.stagers.directory.stage_directory` in this
process (what ``ocistage stage`` does after the interpreter has started) and ``cli`` runs
``ocistage stage`` as a process like rsync (including Python's start-up, ~0.3 s here).
A re-stage that replaced a version returns while a detached remover removes that version
(stagers/remover.py): ``lib`` and ``cli`` are the seconds until the stage returned,
``lib_whole`` and ``cli_whole`` until its remover was done too (the whole work); the next
tool starts only then.
Ratios are ocistage / peer (lower is better); each line ends with its goals (:data:`GOALS`)
and whether this run met them. The page cache is warm for both tools. Raw
numbers go to ``bench/results/stage-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench.bundle import ocistage_script
from bench.images import cache_root, made_once
from bench.plotting import pyplot
from ocistage.cache import leases
from ocistage.cache.leases import Holder
from ocistage.cache.locks import Owner
from ocistage.cache.treeremoval import remove_tree
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.retired import is_remover

RESULTS = Path(__file__).parent / "results"
SYNTHETIC_VERSION = 1
MB = 1 << 20


# -- trees -------------------------------------------------------------------------------------

def make_synthetic(root: Path, files: int = 20_000, total: int = 300 * MB) -> Path:
    """A deterministic tree of ``files`` files in nested dirs, about ``total`` bytes."""
    def fill(work: Path) -> None:
        rng = random.Random(42)
        sizes = [rng.choice([100, 600, 2_000, 6_000, 12_000, 20_000]) for _ in range(files)]
        large = max(0, total - sum(sizes)) // max(1, files // 100)
        for n in range(0, files, 100):
            sizes[n] += large
        block = os.urandom(2 * MB)
        for n, size in enumerate(sizes):
            directory = work / f"d{n // 2000:02d}" / f"e{n // 100:03d}"
            if n % 100 == 0:
                directory.mkdir(parents=True, exist_ok=True)
            start = (n * 7919) % MB
            if size <= MB:
                data = block[start:start + size]
            else:
                data = (block * (size // len(block) + 1))[:size]
            (directory / f"f{n:05d}").write_bytes(n.to_bytes(4, "big") + data)
        for n in range(0, files, 500):  # some symlinks, as in real trees
            os.symlink(f"f{n:05d}",
                       work / f"d{n // 2000:02d}" / f"e{n // 100:03d}" / f"l{n:05d}")

    return made_once(root / f"synthetic-v{SYNTHETIC_VERSION}-{files}-{total // MB}", fill)


def real_bundle(root: Path) -> Path:
    """``ocistage bundle`` of the bench image ``single`` into the bench cache (made once)."""
    from bench.images import build_all

    image = build_all(["single"], root)["single"]
    cache = root / "stage-cache"
    env = {**os.environ, "OCISTAGE_CACHE": str(cache)}
    out = subprocess.run([*ocistage_command(), "bundle", "--json", "-q",
                          f"oci:{image.layout}:{image.name}"], env=env, check=True,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return Path(json.loads(out.stdout)["path"])


def ocistage_command() -> list[str]:
    """The real ``ocistage`` entry point of this interpreter (no version manager's shim)."""
    return [ocistage_script()]


# -- the tools ----------------------------------------------------------------------------------

def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def timed_with_removal(action: Callable[[], object], cache: Path) -> tuple[float, float]:
    """Seconds until ``action`` (a stage) returned, and until the remover it started (if any)
    has removed the replaced version too: the whole work (stagers/remover.py)."""
    start = time.perf_counter()
    action()
    returned = time.perf_counter() - start
    wait_for_removers(cache)
    return returned, time.perf_counter() - start


def wait_for_removers(cache: Path, timeout: float = 600.0) -> None:
    """Return once the removers holding a lease in ``cache`` have ended (polled every 2 ms:
    a remover's lease is taken before its stage returns, and released when it is done)."""
    pids = [lease.holder.pid for lease in leases.all_leases(cache)
            if is_remover(lease) and lease.holder.pid is not None
            and leases.is_live(lease, {})]
    end = time.monotonic() + timeout
    for pid in pids:
        while Owner.of(pid).start is not None and time.monotonic() < end:
            time.sleep(0.002)


def rsync(src: Path, dst: Path) -> None:
    subprocess.run(["rsync", "-a", f"{src}/", f"{dst}/"], check=True,
                   stdin=subprocess.DEVNULL)


def ocistage_lib(src: Path, to: Path, cache: Path) -> None:
    stage_directory(src, to, cache_root=cache, name="staged", holder=Holder.pin("bench"))


def ocistage_cli(src: Path, to: Path, cache: Path) -> None:
    subprocess.run([*ocistage_command(), "stage", str(src), "--to", str(to), "--name",
                    "staged", "--pin", "bench", "-q"],
                   env={**os.environ, "OCISTAGE_CACHE": str(cache)}, check=True,
                   stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def touch_one_percent(tree: Path, round_: int) -> int:
    """Rewrite 1% of the regular files of ``tree`` (new content, new mtime)."""
    files = sorted(p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()
                   and os.access(p, os.W_OK))
    chosen = files[round_ % 100::100]
    for path in chosen:
        with path.open("ab") as out:
            out.write(f"round {round_}\n".encode())
    return len(chosen)


# -- the harness ----------------------------------------------------------------------------------

#: the tools of a run: ocistage in-process and as a process, ``rsync -a`` (into an empty
#: directory for ``first``, in place after that), and ``rsync -a --link-dest`` (re-stages only)
TOOLS = ("lib", "cli", "rsync", "linkdest")


class LinkDest:
    """The peer with ocistage's contract: each re-stage is ``rsync -a --link-dest=CUR SRC/
    NEW/`` (a complete new tree: unchanged files hardlinked from CUR) and then ``rm -rf CUR``
    (the replaced version removed); ``NEW`` becomes ``CUR``. The two are timed apart."""

    def __init__(self, src: Path, base: Path) -> None:
        self.src = src
        self.base = base
        self.current = base.with_name(base.name + "-0")
        self.turn = 0

    def first(self) -> None:
        rsync(self.src, self.current)

    def restage(self) -> tuple[float, float, float, float]:
        """(seconds of the rsync, seconds of removing the replaced tree, seconds of the
        contract's floor: ``cp -al`` of the current tree and ``rm -rf`` of that copy, seconds
        of that ``cp -al`` alone)."""
        self.turn += 1
        farm = self.base.with_name(f"{self.base.name}-farm")
        cpal = timed(partial(subprocess.run, ["cp", "-al", str(self.current), str(farm)],
                             check=True, stdin=subprocess.DEVNULL))
        floor = cpal + timed(partial(subprocess.run, ["rm", "-rf", str(farm)], check=True,
                               stdin=subprocess.DEVNULL))
        new = self.base.with_name(f"{self.base.name}-{self.turn}")
        copy = timed(partial(subprocess.run, [
            "rsync", "-a", f"--link-dest={self.current}", f"{self.src}/", f"{new}/"],
            check=True, stdin=subprocess.DEVNULL))
        removal = timed(partial(subprocess.run, ["rm", "-rf", str(self.current)], check=True,
                                stdin=subprocess.DEVNULL))
        self.current = new
        return copy, removal, floor, cpal


def run_case(tree: Path, target: Path, cache: Path, reps: int,
             changeable: Path | None, with_linkdest: bool = True) -> dict[str, Any]:
    """first / nochange / changed for one (tree, target); returns the samples.

    ``cache`` is the cache the bundle was made in (so a cache bundle is recognised as sealed,
    as with ``ocistage stage REF``); the bench's leases in it are dropped afterwards.
    ``linkdest`` samples are the rsync alone; ``linkdest_rm`` the rsync plus the removal;
    ``linkfarm`` the atomic contract's floor (``cp -al`` + ``rm -rf``, :meth:`LinkDest.restage`),
    ``cpal`` its ``cp -al`` alone.
    """
    tools = ([*TOOLS, "lib_whole", "cli_whole", "linkdest_rm", "linkfarm", "cpal"]
             if with_linkdest else ["lib", "cli", "lib_whole", "cli_whole", "rsync"])
    samples: dict[str, dict[str, list[float]]] = {
        case: {tool: [] for tool in tools} for case in ("first", "nochange", "changed")}
    for rep in range(reps):
        order = [t for t in TOOLS if with_linkdest or t != "linkdest"]
        if rep % 2:
            order.reverse()
        _repetition(tree, target, cache, rep, order, changeable, samples)
        for lease in leases.all_leases(cache):
            if lease.holder.kind == "pin" and lease.holder.name == "bench":
                leases.release(cache, lease.id)
    return _measured(samples, changed=changeable is not None)


def _measured(samples: dict[str, dict[str, list[float]]], changed: bool,
              ) -> dict[str, dict[str, list[float]]]:
    """``samples`` without the tools a case did not time, and without ``changed`` unless
    the tree was changed."""
    return {case: {tool: values for tool, values in tools.items() if values}
            for case, tools in samples.items() if changed or case != "changed"}


def _repetition(tree: Path, target: Path, cache: Path, rep: int, order: list[str],
                changeable: Path | None, samples: dict[str, dict[str, list[float]]]) -> None:
    """One repetition of every case, the tools in ``order``, into ``samples``."""
    dests = {tool: target / f"{tool}-{rep}" for tool in ("lib", "cli", "rsync")}
    peer = LinkDest(tree, target / f"linkdest-{rep}")
    actions: dict[str, Callable[[], object]] = {
        "lib": partial(ocistage_lib, tree, dests["lib"], cache),
        "cli": partial(ocistage_cli, tree, dests["cli"], cache),
        "rsync": partial(rsync, tree, dests["rsync"]),
        "linkdest": peer.first,  # its first tree: an rsync -a, not timed apart
    }
    for tool in order:
        elapsed = timed(actions[tool])
        if tool != "linkdest":
            samples["first"][tool].append(elapsed)
    for case in ("nochange", "changed"):
        if case == "changed":
            if changeable is None:
                break
            touch_one_percent(changeable, rep)
        for tool in order:
            if tool == "linkdest":
                copy, removal, floor, cpal = peer.restage()
                samples[case]["linkdest"].append(copy)
                samples[case]["linkdest_rm"].append(copy + removal)
                samples[case]["linkfarm"].append(floor)
                samples[case]["cpal"].append(cpal)
            elif tool in ("lib", "cli"):  # the replaced version's remover: waited for
                returned, whole = timed_with_removal(actions[tool], cache)
                samples[case][tool].append(returned)
                samples[case][f"{tool}_whole"].append(whole)
            else:
                samples[case][tool].append(timed(actions[tool]))
    for dest in (*dests.values(), peer.current):
        remove_tree(dest)


def summarise(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    summary = {}
    for case, tools in samples.items():
        medians = {tool: statistics.median(values) for tool, values in tools.items()}
        summary[case] = {**{f"{tool}_s": round(v, 4) for tool, v in medians.items()},
                         "lib_ratio": round(medians["lib"] / medians["rsync"], 3),
                         "cli_ratio": round(medians["cli"] / medians["rsync"], 3)}
        if "linkdest_rm" in medians:
            summary[case]["cli_linkdest_rm_ratio"] = round(
                medians["cli"] / medians["linkdest_rm"], 3)
            summary[case]["cli_linkdest_ratio"] = round(medians["cli"] / medians["linkdest"], 3)
        if "linkfarm" in medians:
            summary[case]["linkfarm_rsync_ratio"] = round(
                medians["linkfarm"] / medians["rsync"], 3)
    return summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--trees", default="bundle,bundle-copy,synthetic")
    parser.add_argument("--targets", default="same-fs,tmpfs")
    parser.add_argument("--files", default="20000",
                        help="files of the synthetic tree; several (10000,30000,100000) make "
                             "a scaling run with a plot, each tree of --megabytes scaled by "
                             "its share of the largest (the same bytes per file)")
    parser.add_argument("--megabytes", type=int, default=300)
    parser.add_argument("--no-linkdest", action="store_true",
                        help="leave out the rsync --link-dest peer")
    args = parser.parse_args(argv)
    if shutil.which("rsync") is None:
        print("bench: rsync is not installed", file=sys.stderr)
        return 1
    counts = [int(n) for n in args.files.split(",")]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    work = root / f"stage-work-{os.getpid()}"
    work.mkdir()
    started = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "load": _load()}
    results: list[dict[str, Any]] = []
    try:
        for tree_name, (tree, changeable) in _trees(args.trees.split(","), counts,
                                                   args.megabytes, root, work):
            for target_name in args.targets.split(","):
                results.append(_run_target(tree_name, tree, changeable, target_name, work,
                                           root, args.reps, not args.no_linkdest))
    finally:
        remove_tree(work)
    print(render(results))
    document = {"command": "python -m bench stage " + " ".join(argv), "reps": args.reps,
                **started, "load_after": _load(), "results": results}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"stage-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(document, indent=2))
    print(f"bench: raw results in {out}")
    if len(counts) > 1 and plot_scaling(document, out.with_suffix(".png")):
        shutil.copyfile(out.with_suffix(".png"), Path(__file__).parent / "restage-scale.png")
        print(f"bench: plot in {out.with_suffix('.png')}, copied to bench/restage-scale.png")
    return 0


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _trees(wanted: list[str], counts: list[int], megabytes: int, root: Path, work: Path,
           ) -> Iterator[tuple[str, tuple[Path, Path | None]]]:
    """(name, (tree, the tree to change or None)) of each wanted source; a synthetic tree is
    copied into ``work`` (changed there) and removed again after its runs."""
    if "bundle" in wanted or "bundle-copy" in wanted:
        bundle = real_bundle(root)
        if "bundle" in wanted:
            yield "bundle", (bundle, None)
        if "bundle-copy" in wanted:
            copy = work / "bundle-copy"
            subprocess.run(["cp", "-a", str(bundle), str(copy)], check=True)
            yield "bundle-copy", (copy, copy)
            remove_tree(copy)
    if "synthetic" in wanted:
        for files in counts:
            total = megabytes * MB * files // max(counts)
            synthetic = make_synthetic(root, files, total)
            copy = work / "synthetic"
            subprocess.run(["cp", "-a", str(synthetic), str(copy)], check=True)
            yield "synthetic", (copy, copy)
            remove_tree(copy)


def _run_target(tree_name: str, tree: Path, changeable: Path | None, target_name: str,
                work: Path, root: Path, reps: int, with_linkdest: bool) -> dict[str, Any]:
    if target_name == "tmpfs":
        target = Path("/dev/shm") / f"ocistage-bench-{os.getpid()}"
    else:
        target = work / "targets"
    target.mkdir(exist_ok=True)
    try:
        print(f"bench: {tree_name} -> {target_name} ({reps} reps)", flush=True)
        samples = run_case(tree, target, root / "stage-cache", reps, changeable,
                           with_linkdest)
    finally:
        remove_tree(target)
    files = sum(1 for p in tree.rglob("*") if p.is_file())
    return {"tree": tree_name, "target": target_name, "files": files,
            "samples": samples, "summary": summarise(samples)}


#: what the scaling plot draws per case: (timing, label)
_SCALE_LINES = {
    "first": (("cli", "ocistage stage"), ("rsync", "rsync -a")),
    "nochange": (("cli", "ocistage stage"), ("rsync", "rsync -a (in place)"),
                 ("linkdest_rm", "rsync --link-dest + rm old")),
    "changed": (("cli", "ocistage stage"), ("rsync", "rsync -a (in place)"),
                ("linkdest", "rsync --link-dest"),
                ("linkdest_rm", "rsync --link-dest + rm old"),
                ("linkfarm", "cp -al + rm -rf (the atomic floor)")),
}


def plot_scaling(document: dict[str, Any], path: Path) -> bool:
    """Seconds against files of the synthetic tree onto tmpfs, one panel per case (first
    stage, unchanged and 1%-changed re-stage), one line per tool, log-log; False without
    matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    points = sorted((r for r in document["results"]
                     if r["tree"] == "synthetic" and r["target"] == "tmpfs"),
                    key=lambda r: r["files"])
    if len(points) < 2:
        return False
    figure, axes = plt.subplots(1, 3, figsize=(14, 4.5))
    for ax, (case, lines) in zip(axes, _SCALE_LINES.items(), strict=True):
        for key, label in lines:
            xs = [p["files"] for p in points if f"{key}_s" in p["summary"].get(case, {})]
            ys = [p["summary"][case][f"{key}_s"] for p in points
                  if f"{key}_s" in p["summary"].get(case, {})]
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_title({"first": "first stage", "nochange": "re-stage, unchanged",
                      "changed": "re-stage, 1% changed"}[case])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("files")
        ax.set_ylabel("seconds (median, as processes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(f"ocistage bench stage, synthetic tree -> tmpfs, {document['date']}, "
                    f"load {document['load']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


#: the goals, as (case, ocistage's timing, peer, at most ocistage / peer): issue 16's first
#: stage in-process (the copy itself) and unchanged re-stage as processes; issue 29's
#: 1%-changed re-stage as processes, against ``rsync -a`` in place and against the peer with
#: the same atomic contract, ``rsync --link-dest`` plus removing the replaced tree
GOALS: tuple[tuple[str, str, str, float], ...] = (
    ("first", "lib", "rsync", 0.5),
    ("nochange", "cli", "rsync", 1.0),
    ("changed", "cli", "cpal", 1.3),
    ("changed", "cli_whole", "linkfarm", 1.5),
    ("changed", "cli_whole", "linkdest_rm", 0.5),
)
_PEER_NAMES = {"rsync": "rsync", "linkdest_rm": "ld+rm", "cpal": "cp -al",
               "linkfarm": "cp -al+rm"}


def goals_of(case: str, summary: dict[str, float]) -> list[str]:
    """This case's goals as ``tool/peer RATIO (goal <= LIMIT) OK|MISSED``."""
    found = []
    for goal_case, tool, peer, limit in GOALS:
        if goal_case != case or f"{peer}_s" not in summary or not summary[f"{peer}_s"] \
                or f"{tool}_s" not in summary:
            continue
        ratio = summary[f"{tool}_s"] / summary[f"{peer}_s"]
        verdict = "OK" if ratio <= limit else "MISSED"
        found.append(f"{tool}/{_PEER_NAMES[peer]} {ratio:.2f} (goal <= {limit}) {verdict}")
    return found


def render(results: list[dict[str, Any]]) -> str:
    lines = [f"{'tree':<12} {'target':<8} {'files':>7} {'case':<9} {'ocistage lib':>12} "
             f"{'cli':>8} {'rsync -a':>9} {'link-dest':>10} {'+rm':>8} {'cli/rsync':>10} "
             f"{'cli/ld+rm':>10} {'cp -al+rm':>10} {'/rsync':>7}  goals"]
    for result in results:
        for case, s in result["summary"].items():
            linkdest = f"{s['linkdest_s']:>9.3f}s" if "linkdest_s" in s else f"{'':>10}"
            with_rm = f"{s['linkdest_rm_s']:>7.3f}s" if "linkdest_rm_s" in s else f"{'':>8}"
            ld_ratio = s.get("cli_linkdest_rm_ratio")
            farm = (f"{s['linkfarm_s']:>9.3f}s {s['linkfarm_rsync_ratio']:>7.2f}"
                    if "linkfarm_s" in s else f"{'':>18}")
            lines.append(f"{result['tree']:<12} {result['target']:<8} {result['files']:>7} "
                         f"{case:<9} {s['lib_s']:>11.3f}s {s['cli_s']:>7.3f}s "
                         f"{s['rsync_s']:>8.3f}s {linkdest} {with_rm} "
                         f"{s['cli_ratio']:>10.3f} "
                         f"{'' if ld_ratio is None else f'{ld_ratio:.3f}':>10} {farm}  "
                         + "; ".join(goals_of(case, s)))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

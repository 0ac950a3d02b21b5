"""``python -m bench.stage``: ``ocistage stage`` against ``rsync -a``, side by side in one run.

Trees (sources):

- ``bundle``     a real bundle made by ``ocistage bundle`` of the bench image ``single``
                 (bench/images.py: ~200 MB, ~10k files from /usr) into a bench cache; it is a
                 cache bundle, so ocistage treats it as sealed (see stagers/stage.py)
- ``bundle-copy`` the same bundle copied outside the cache (``cp -a``): an arbitrary tree,
                 walked and stat-compared on every re-stage
- ``synthetic``  ``--files`` files (default 20k; 100k and 300k for issue 16's big trees) of
                 about ``--megabytes`` in all, made on the spot (cached between runs), sizes
                 from 100 B to 1 MB as in a distribution image

Targets: ``same-fs`` (a directory beside the source: ocistage hardlinks the sealed ``bundle``
and copies the other trees into the target's pool: only cache content shares inodes with a
staged tree) and ``tmpfs`` (``/dev/shm``, another filesystem: ocistage copies into the
target's pool).

Cases, each as the median of ``--reps`` repetitions with the order of the two tools
alternating (A/B, B/A, ...):

- ``first``     stage into an empty target vs ``rsync -a SRC/ DST/`` into an empty directory
- ``nochange``  the same again, nothing changed
- ``changed``   after rewriting 1% of the files of the source (new content and mtime)

ocistage is measured twice: ``lib`` calls :func:`ocistage.stagers.stage.stage_directory` in this
process (what ``ocistage stage`` does after the interpreter has started) and ``cli`` runs
``ocistage stage`` as a process like rsync (including Python's start-up, ~0.3 s here).
Ratios are ocistage / rsync (lower is better); each line ends with its goal (:data:`GOALS`)
and whether this run met it. The page cache is warm for both tools. Raw
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
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench.bundle import ocistage_script
from bench.images import cache_root
from ocistage.cache import leases
from ocistage.cache.fsops import remove_tree
from ocistage.cache.leases import Holder
from ocistage.stagers.stage import stage_directory

RESULTS = Path(__file__).parent / "results"
SYNTHETIC_VERSION = 1
MB = 1 << 20


# -- trees -------------------------------------------------------------------------------------

def make_synthetic(root: Path, files: int = 20_000, total: int = 300 * MB) -> Path:
    """A deterministic tree of ``files`` files in nested dirs, about ``total`` bytes."""
    tree = root / f"synthetic-v{SYNTHETIC_VERSION}-{files}-{total // MB}"
    if tree.is_dir():
        return tree
    print(f"bench: making the synthetic tree {tree} (once)", flush=True)
    work = tree.with_name(tree.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
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
        os.symlink(f"f{n:05d}", work / f"d{n // 2000:02d}" / f"e{n // 100:03d}" / f"l{n:05d}")
    work.rename(tree)
    return tree


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

def run_case(tree: Path, target: Path, cache: Path, reps: int,
             changeable: Path | None) -> dict[str, Any]:
    """first / nochange / changed for one (tree, target); returns the samples.

    ``cache`` is the cache the bundle was made in (so a cache bundle is recognised as sealed,
    as with ``ocistage stage REF``); the bench's leases in it are dropped afterwards.
    """
    samples: dict[str, dict[str, list[float]]] = {
        case: {"lib": [], "cli": [], "rsync": []} for case in ("first", "nochange", "changed")}
    for rep in range(reps):
        dests = {tool: target / f"{tool}-{rep}" for tool in ("lib", "cli", "rsync")}
        order = ["lib", "cli", "rsync"] if rep % 2 == 0 else ["rsync", "cli", "lib"]
        actions: dict[str, Callable[[], object]] = {
            "lib": partial(ocistage_lib, tree, dests["lib"], cache),
            "cli": partial(ocistage_cli, tree, dests["cli"], cache),
            "rsync": partial(rsync, tree, dests["rsync"]),
        }
        for case in ("first", "nochange"):
            for tool in order:
                samples[case][tool].append(timed(actions[tool]))
        if changeable is not None:
            touch_one_percent(changeable, rep)
            for tool in order:
                samples["changed"][tool].append(timed(actions[tool]))
        for dest in dests.values():
            remove_tree(dest)
        for lease in leases.all_leases(cache):
            if lease.holder.kind == "pin" and lease.holder.name == "bench":
                leases.release(cache, lease.id)
    if changeable is None:
        del samples["changed"]
    return samples


def summarise(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    summary = {}
    for case, tools in samples.items():
        medians = {tool: statistics.median(values) for tool, values in tools.items()}
        summary[case] = {**{f"{tool}_s": round(v, 4) for tool, v in medians.items()},
                         "lib_ratio": round(medians["lib"] / medians["rsync"], 3),
                         "cli_ratio": round(medians["cli"] / medians["rsync"], 3)}
    return summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--trees", default="bundle,bundle-copy,synthetic")
    parser.add_argument("--targets", default="same-fs,tmpfs")
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--megabytes", type=int, default=300)
    args = parser.parse_args(argv)
    if shutil.which("rsync") is None:
        print("bench: rsync is not installed", file=sys.stderr)
        return 1
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    work = root / f"stage-work-{os.getpid()}"
    work.mkdir()
    results: list[dict[str, Any]] = []
    try:
        trees: dict[str, tuple[Path, Path | None]] = {}
        wanted = args.trees.split(",")
        if "bundle" in wanted or "bundle-copy" in wanted:
            bundle = real_bundle(root)
            if "bundle" in wanted:
                trees["bundle"] = (bundle, None)
            if "bundle-copy" in wanted:
                copy = work / "bundle-copy"
                subprocess.run(["cp", "-a", str(bundle), str(copy)], check=True)
                trees["bundle-copy"] = (copy, copy)
        if "synthetic" in wanted:
            synthetic = make_synthetic(root, args.files, args.megabytes * MB)
            copy = work / "synthetic"
            subprocess.run(["cp", "-a", str(synthetic), str(copy)], check=True)
            trees["synthetic"] = (copy, copy)
        for tree_name, (tree, changeable) in trees.items():
            for target_name in args.targets.split(","):
                if target_name == "tmpfs":
                    target = Path("/dev/shm") / f"ocistage-bench-{os.getpid()}"
                else:
                    target = work / "targets"
                target.mkdir(exist_ok=True)
                try:
                    print(f"bench: {tree_name} -> {target_name} ({args.reps} reps)",
                          flush=True)
                    samples = run_case(tree, target, root / "stage-cache", args.reps,
                                       changeable)
                finally:
                    remove_tree(target)
                files = sum(1 for p in tree.rglob("*") if p.is_file())
                results.append({"tree": tree_name, "target": target_name, "files": files,
                                "samples": samples, "summary": summarise(samples)})
    finally:
        remove_tree(work)
    print(render(results))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"stage-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps({"reps": args.reps, "results": results}, indent=2))
    print(f"bench: raw results in {out}")
    return 0


#: the goals of issue 16, by case: (which ratio, at most). ``first`` in-process (the copy
#: itself); a re-stage as processes (``ocistage stage`` incl. start-up vs ``rsync -a``)
GOALS: dict[str, tuple[str, float]] = {
    "first": ("lib", 0.5),
    "nochange": ("cli", 1.0),
    "changed": ("cli", 1.0),
}


def render(results: list[dict[str, Any]]) -> str:
    lines = [f"{'tree':<12} {'target':<8} {'files':>7} {'case':<9} {'ocistage lib':>12} "
             f"{'cli':>8} {'rsync -a':>9} {'lib/rsync':>10} {'cli/rsync':>10}  goal"]
    for result in results:
        for case, s in result["summary"].items():
            tool, limit = GOALS[case]
            ratio = s[f"{tool}_ratio"]
            verdict = "OK" if ratio <= limit else "MISSED"
            lines.append(f"{result['tree']:<12} {result['target']:<8} {result['files']:>7} "
                         f"{case:<9} {s['lib_s']:>11.3f}s {s['cli_s']:>7.3f}s "
                         f"{s['rsync_s']:>8.3f}s {s['lib_ratio']:>10.3f} "
                         f"{s['cli_ratio']:>10.3f}  {tool}/rsync {ratio:.2f} "
                         f"(goal <= {limit}) {verdict}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

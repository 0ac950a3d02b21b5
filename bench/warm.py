"""``python -m bench warm``: G4's start-up, ``ocistage --version`` against a warm bundle, side by
side for one or more checkouts (A/B of a change against main), wall time and CPU time.

G4: a warm ``bundle REF --pull missing`` within 2x ``ocistage --version``, with the tag
re-resolved at the registry within 3x. ``python -m bench bundle`` times these as wall clock
only, each sample after a cold bundle into a new cache; on this shared 2-core machine the wall
times of a few tens of ms spread 2-4x when other work runs, so this harness alternates many
short rounds and reports CPU time (user + system of the process, ``wait4``) beside the wall.

Each checkout (``--trees``, default: this one) runs its own ``.venv/bin/ocistage``, byte-compiled
first, with a cache of its own that one untimed cold ``bundle REF`` fills. Then, ``--rounds``
times, in alternating order:

- ``--version``         ``ocistage --version``
- ``missing``           ``ocistage bundle --json --pull missing REF`` (the cached bundle, no
                        network)
- ``always``            ``ocistage bundle --json REF`` (the registry asked for the tag)

The image (``--image``, default ``single``) is served by a ``docker-registry`` on 127.0.0.1
(bench/images.py). The caches live under ``OCISTAGE_BENCH_CACHE`` (the disk by default;
``/dev/shm/...`` for tmpfs). Raw samples go to ``bench/results/warm-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.bundle import RESULTS, load_images, ocistage_env, running_registry
from bench.images import cache_root, push
from ocistage.cache.treeremoval import remove_tree

RUNS = ("--version", "missing", "always")
PACKAGES = ("bundler", "cache", "stagers", "runtimes", "ocistage")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one process, its stdout discarded; raises if it fails."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        start = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)])
        _, status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - start
    finally:
        os.close(devnull)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({os.waitstatus_to_exitcode(status)})")
    return wall, usage.ru_utime + usage.ru_stime


def command(tree: Path, run: str, ref: str) -> list[str]:
    script = str(tree / ".venv" / "bin" / "ocistage")
    return {"--version": [script, "--version"],
            "missing": [script, "bundle", "--json", "--pull", "missing", ref],
            "always": [script, "bundle", "--json", ref]}[run]


def summary(samples: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    """Medians and minimums of wall and CPU per run, and the two G4 ratios of each."""
    out: dict[str, dict[str, float]] = {}
    for run, values in samples.items():
        walls, cpus = [w for w, _ in values], [c for _, c in values]
        out[run] = {"wall": statistics.median(walls), "wall_min": min(walls),
                    "cpu": statistics.median(cpus), "cpu_min": min(cpus)}
    for key in ("wall", "cpu", "wall_min", "cpu_min"):
        out.setdefault("ratios", {})[f"missing/version {key}"] = (
            out["missing"][key] / out["--version"][key])
        out["ratios"][f"always/version {key}"] = out["always"][key] / out["--version"][key]
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench warm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default=str(Path(__file__).resolve().parents[1]),
                        help="comma-separated checkouts, each with its .venv [this one]")
    parser.add_argument("--rounds", type=int, default=21, help="rounds of every run [21]")
    parser.add_argument("--image", default="single", help="bench image [single]")
    args = parser.parse_args(argv)
    trees = [Path(tree).resolve() for tree in args.trees.split(",")]
    for tree in trees:
        if not (tree / ".venv" / "bin" / "ocistage").is_file():
            print(f"bench warm: {tree} has no .venv/bin/ocistage (make venv there)")
            return 1
        for package in PACKAGES:
            compileall.compile_dir(tree / package, quiet=1)
    root = cache_root()
    image = load_images([args.image])[args.image]
    work = root / f"warm-work-{os.getpid()}"
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {str(t): {} for t in trees}
    load = [os.getloadavg()]
    try:
        with running_registry(root / "registry" / "storage") as registry:
            ref = push(image, registry.host)
            envs = {}
            for n, tree in enumerate(trees):
                (work / "home").mkdir(parents=True, exist_ok=True)
                envs[tree] = ocistage_env(work / f"cache-{n}", work / "home")
                timed(command(tree, "missing", ref), envs[tree])  # cold: fills the cache
            for round_ in range(args.rounds):
                order = [(tree, run) for tree in trees for run in RUNS]
                for tree, run in order if round_ % 2 == 0 else reversed(order):
                    samples[str(tree)].setdefault(run, []).append(
                        timed(command(tree, run, ref), envs[tree]))
    finally:
        remove_tree(work)
    load.append(os.getloadavg())
    results = {tree: summary(runs) for tree, runs in samples.items()}
    for tree, result in results.items():
        print(tree)
        for run in RUNS:
            r = result[run]
            print(f"  {run:10s} wall {r['wall'] * 1e3:6.1f} ms (min {r['wall_min'] * 1e3:6.1f})"
                  f"  CPU {r['cpu'] * 1e3:6.1f} ms (min {r['cpu_min'] * 1e3:6.1f})")
        ratios = result["ratios"]
        print("  missing / --version: wall {:.2f}, CPU {:.2f} (goal <= 2)".format(
            ratios["missing/version wall"], ratios["missing/version cpu"]))
        print("  always / --version:  wall {:.2f}, CPU {:.2f} (goal <= 3)".format(
            ratios["always/version wall"], ratios["always/version cpu"]))
    print(f"load {load[0][0]:.1f} before, {load[1][0]:.1f} after")
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"warm-{stamp}.json"
    out.write_text(json.dumps({"when": stamp, "load": load, "cache": str(root),
                               "rounds": args.rounds, "image": args.image,
                               "samples": samples, "results": results}, indent=2))
    print(f"bench: raw results in {out}")
    return 0

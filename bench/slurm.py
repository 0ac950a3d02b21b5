"""``python -m bench slurm``: stage an image on 1 and on 3 nodes of the Slurm 24.05 test cluster.

Starts the private three-node cluster of ``pytest_ocistage/slurm.py`` (needs root and the build of
``.ci/build-slurm.sh``), a bench registry, and one counting proxy per node
(``pytest_ocistage/faultproxy.py``, no faults armed). The image is named by a registry address that
nothing listens on; each node's ``XDG_CONFIG_HOME`` is in its node-local directory and its
``config.toml`` makes that node's proxy the mirror of that address, so every registry request
of a node (of any ocistage process on it) goes through its own proxy, and a request that
bypassed the proxies would fail the run instead of going uncounted.

Modes, each cold (node-local directories, caches and counters emptied before every run):

- ``per-node``   ``srun -N{n} --ntasks-per-node=1 ocistage stage REF --to NODE_LOCAL/staged``
                 with a node-local cache: every node pulls for itself;
- ``all-nodes``  ``sbatch -N{n} --wait --wrap 'ocistage stage --all-nodes REF --to
                 NODE_LOCAL/staged'`` with a cache on the shared filesystem: the batch step
                 resolves the image once, then stages on every node (issue 12, item 2).

Reported per mode and node count (medians over the repetitions): the staging wall time as the
job's shells saw it (first node's start to last node's end; ``slurm_seconds`` in the JSON is
the whole srun / ``sbatch --wait`` from the host, which adds ``sbatch --wait``'s polling, ~40
s), and per node the registry requests (GETs of manifests and of blobs, HEADs) and the response
bytes. The raw samples go to ``bench/results/slurm-<time>.json``. A run that fails is reported
with its error, not retried.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bundle import RESULTS, ocistage_script, running_registry
from bench.images import SPECS, build_all, cache_root, push
from pytest_ocistage.clusterspec import ClusterError, built_spec, check_spec
from pytest_ocistage.components import free_port
from pytest_ocistage.faultproxy import FaultProxy, running_fault_proxy
from pytest_ocistage.slurm import SlurmCluster, running_cluster

MODES = ("per-node", "all-nodes")


@dataclass
class NodeTraffic:
    requests: int = 0
    manifest_gets: int = 0
    blob_gets: int = 0
    bytes: int = 0


@dataclass
class Run:
    mode: str
    nodes: int
    seconds: float        # staging, inside the job: first node's start to last node's end
    slurm_seconds: float  # the whole srun / sbatch --wait, as the submitting host saw it
    ok: bool
    error: str = ""
    traffic: dict[str, NodeTraffic] = field(default_factory=dict)


def _traffic(proxy: FaultProxy) -> NodeTraffic:
    requests = proxy.requests
    return NodeTraffic(
        requests=len(requests),
        manifest_gets=sum(1 for r in requests if r.method == "GET" and "/manifests/" in r.path),
        blob_gets=sum(1 for r in requests if r.method == "GET" and "/blobs/" in r.path),
        bytes=proxy.bytes_sent)


def _reset(cluster: SlurmCluster, work: Path, proxies: dict[str, FaultProxy]) -> None:
    for node in cluster.nodes:
        for name in ("staged", "cache"):
            shutil.rmtree(cluster.node_dir(node) / name, ignore_errors=True)
    shutil.rmtree(work / "cache", ignore_errors=True)
    for proxy in proxies.values():
        proxy.clear()


def _timed(command: str, work: Path) -> str:
    """command in a shell that appends ``NODE START END`` (epoch seconds) to work/times."""
    return (f's=$(date +%s.%N); {command}; rc=$?; '
            f'echo "$SLURMD_NODENAME $s $(date +%s.%N)" >> {work}/times; exit $rc')


def _command(mode: str, count: int, ref: str, cluster: SlurmCluster, work: Path) -> list[str]:
    local = cluster.node_local
    ocistage = shlex.quote(ocistage_script())
    if mode == "per-node":
        script = _timed(f"XDG_CONFIG_HOME={local}/config OCISTAGE_CACHE={local}/cache "
                        f"{ocistage} stage {ref} --to {local}/staged --name image", work)
        return ["srun", "--time=10", f"-N{count}", "--ntasks-per-node=1", "/bin/sh", "-c",
                script]
    script = _timed(f"XDG_CONFIG_HOME={local}/config OCISTAGE_CACHE={work}/cache "
                    f"{ocistage} stage --all-nodes {ref} --to {local}/staged --name image", work)
    return ["sbatch", "--time=10", f"-N{count}", "--wait", f"--output={work}/job-%j.out",
            "--wrap", script]


def _staging_seconds(work: Path) -> float:
    """From the first node's start to the last node's end, as the job's shells saw them."""
    spans = [line.split() for line in (work / "times").read_text().splitlines() if line]
    return max(float(end) for _, _, end in spans) - min(float(start) for _, start, _ in spans)


def run_once(mode: str, count: int, ref: str, cluster: SlurmCluster, work: Path,
             proxies: dict[str, FaultProxy], env: dict[str, str]) -> Run:
    _reset(cluster, work, proxies)
    for old in [*work.glob("job-*.out"), *work.glob("times")]:
        old.unlink()
    os.sync()
    start = time.perf_counter()
    result = cluster.run(*_command(mode, count, ref, cluster, work), env=env, cwd=work,
                         timeout=900)
    slurm_seconds = time.perf_counter() - start
    seconds = _staging_seconds(work) if (work / "times").is_file() else slurm_seconds
    staged = [node for node in cluster.nodes[:count]
              if (cluster.node_dir(node) / "staged" / "image" / "rootfs").is_dir()]
    ok = result.returncode == 0 and len(staged) == count
    error = ""
    if not ok:
        outputs = "".join(path.read_text(errors="replace") for path in work.glob("job-*.out"))
        error = (result.stderr + result.stdout + outputs).strip()[-600:]
    return Run(mode, count, seconds, slurm_seconds, ok, error,
               {node: _traffic(proxies[node]) for node in cluster.nodes})


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(runs: list[Run], nodes: list[str]) -> str:
    lines = [f"{'mode':<10} {'nodes':>5} {'wall':>8}  " +
             "  ".join(f"{node + ' req (man/blob)':>20} {node + ' MB':>8}" for node in nodes)]
    keys = sorted({(run.mode, run.nodes) for run in runs}, key=lambda k: (MODES.index(k[0]), k[1]))
    for mode, count in keys:
        group = [run for run in runs if (run.mode, run.nodes) == (mode, count)]
        good = [run for run in group if run.ok]
        if not good:
            lines.append(f"{mode:<10} {count:>5}   failed: {group[0].error.splitlines()[-1:]}")
            continue
        cells = []
        for node in nodes:
            traffic = [run.traffic[node] for run in good]
            requests = _median([float(t.requests) for t in traffic])
            manifests = _median([float(t.manifest_gets) for t in traffic])
            blobs = _median([float(t.blob_gets) for t in traffic])
            megabytes = _median([t.bytes / 1e6 for t in traffic])
            cells.append(f"{f'{requests:.0f} ({manifests:.0f}/{blobs:.0f})':>20} "
                         f"{megabytes:>8.1f}")
        failed = len(group) - len(good)
        note = f"  ({failed} of {len(group)} failed)" if failed else ""
        lines.append(f"{mode:<10} {count:>5} {_median([r.seconds for r in good]):>7.2f}s  "
                     + "  ".join(cells) + note)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench slurm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default="multi", choices=sorted(SPECS),
                        help="bench image (bench/images.py) [multi]")
    parser.add_argument("--reps", type=int, default=3, help="repetitions [3]")
    parser.add_argument("--nodes", default="1,3", help="node counts [1,3]")
    parser.add_argument("--modes", default=",".join(MODES), help=f"[{','.join(MODES)}]")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.nodes.split(",") if n]
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes) or any(not 1 <= n <= 3 for n in counts):
        parser.error(f"modes are {', '.join(MODES)}; node counts 1 to 3")
    spec = built_spec()
    problem = check_spec(spec)
    if problem is not None:
        print(f"bench slurm: {problem}", file=sys.stderr)
        return 2
    image = build_all([args.image])[args.image]
    runs: list[Run] = []
    with ExitStack() as stack:
        storage = cache_root() / "slurm-registry" / "storage"
        registry = stack.enter_context(running_registry(storage))
        push(image, registry.host)
        try:
            cluster = stack.enter_context(running_cluster(spec, [ocistage_script()]))
        except ClusterError as exc:
            print(f"bench slurm: {exc}", file=sys.stderr)
            return 2
        proxies = {node: stack.enter_context(running_fault_proxy(f"http://{registry.host}"))
                   for node in cluster.nodes}
        nowhere = f"127.0.0.1:{free_port()}"  # only the mirrors answer for this registry
        ref = f"{nowhere}/bench/{image.name}:latest"
        for node, proxy in proxies.items():
            config = cluster.node_dir(node) / "config" / "ocistage" / "config.toml"
            config.parent.mkdir(parents=True)
            config.write_text(f'[registries."{nowhere}"]\nmirrors = ["{proxy.url}"]\n')
        work = Path(tempfile.mkdtemp(prefix="ocistage-bench-slurm-", dir="/tmp"))
        stack.callback(shutil.rmtree, work, True)
        work.chmod(0o755)
        (work / "home").mkdir()
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("OCISTAGE_", "XDG_"))}
        env.update({"HOME": str(work / "home"), "NO_PROXY": "127.0.0.1,localhost",
                    "NO_COLOR": "1"})
        print(f"bench slurm: image {image.name} ({image.compressed / 1e6:.0f} MB compressed, "
              f"{len(image.layers)} layers, {image.entries} entries), Slurm {cluster.version}, "
              f"{args.reps} reps", flush=True)
        for rep in range(args.reps):
            order = modes if rep % 2 == 0 else list(reversed(modes))
            for count in counts:
                for mode in order:
                    run = run_once(mode, count, ref, cluster, work, proxies, env)
                    runs.append(run)
                    state = "ok" if run.ok else f"FAILED: {run.error.splitlines()[-1:]}"
                    print(f"  rep {rep + 1} {mode:<9} -N{count}: {run.seconds:6.2f}s {state}",
                          flush=True)
        table = report(runs, list(cluster.nodes))
    print(table)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"slurm-{stamp}.json"
    document: dict[str, Any] = {"image": image.name, "reps": args.reps,
                                "runs": [asdict(run) for run in runs]}
    out.write_text(json.dumps(document, indent=2))
    print(f"raw samples: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

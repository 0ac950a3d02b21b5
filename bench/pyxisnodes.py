"""``python -m bench pyxisnodes``: ``srun --container-image`` on one node and on three at once,
through the real pyxis cluster with ocistage's importer (G9, issue 37).

The cluster is the one of tests/e2e/test_pyxis_importer.py, started from the same plain
functions (:mod:`pytest_ocistage.pyxiscluster`): Slurm 24.05 with three nodes on this host,
pyxis 0.24.0 (``importer=... use_squashfuse=1``) and enroot 4.1.2 as
``.ci/build-enroot-pyxis.sh`` builds them, the importer installed from this checkout's wheel
into a venv made with /usr/bin/python3, and a ``mksquashfs`` first on slurmd's PATH that logs
every build. pyxis's ``importer=`` is a small wrapper of the installed importer that appends
``NODE COMMAND START END`` to a log, so that the importer's share of a step can be told from
srun's and pyxis's.

Images, pushed to a bench ``docker-registry`` and named through a counting proxy
(``pytest_ocistage/faultproxy.py``) so that every registry request of every node is counted:

- ``synthetic``  the busybox fixture's layer under a synthetic image (:mod:`bench.synthetic`,
                 ``--files`` files of ``--megabytes`` MB in four gzip layers): a realistic size
                 with a ``/bin/true`` to run
- ``busybox``    the small busybox fixture alone

Cases, per image and per user (root, and the job user ``ocistage-pyxbench``, made and removed
here), in alternating order between repetitions; a cold case has an empty store and cache (one
shared store, ``OCISTAGE_CACHE`` in a /tmp directory every node sees, as a site's or a group's):

- ``N1 cold``   ``srun -N1 --container-image=REG#IMAGE true``
- ``N3 cold``   ``srun -N3 --ntasks-per-node=1 --container-image=REG#IMAGE true``
- ``N1 warm``, ``N3 warm``  the same again, right after the cold one, on its store: no build
                and no registry request, what is left is each node's own work (pyxis, enroot,
                the importer's ``get`` and ``release``)
- ``N1 plain``, ``N3 plain``  ``srun -N1 true`` and ``srun -N3 --ntasks-per-node=1 true``
                without a container (once per repetition, as root): srun's own share

Reported: the median wall time of each srun as this host saw it, N3 cold / N1 cold (the goal:
at most 1.3), the mksquashfs builds and registry requests (manifest GETs, blob GETs) per step,
and the importer's share: the median of its longest ``get`` on a node of the step (wall) and of
the CPU time of all its commands in the step (every node's ``get`` and ``release``); then
where the steps' time went, phase by phase (:func:`phases`). The page
cache is not dropped (the machine is shared). Raw runs go to
``bench/results/pyxisnodes-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bundle import RESULTS, running_registry
from bench.images import MB, _Layout, add_image, cache_root
from bench.synthetic import SynthSpec, build_synthetic
from pytest_ocistage.clusterspec import ClusterError, built_spec, check_spec
from pytest_ocistage.faultproxy import FaultProxy, running_fault_proxy
from pytest_ocistage.images import fixture_layouts
from pytest_ocistage.jobuser import JobUser, job_user_account
from pytest_ocistage.pyxiscluster import (
    enroot_pyxis_prefix,
    installed_importer,
    job_export,
    logging_mksquashfs,
    mksquashfs_builds,
    pyxis_spec,
)
from pytest_ocistage.runner import ocistage_command
from pytest_ocistage.slurm import SlurmCluster, running_cluster

CASES = ("N1 cold", "N3 cold", "N1 warm", "N3 warm", "N1 plain", "N3 plain")
IMAGES = ("synthetic", "busybox")
USERS = ("root", "user")
GOAL = 1.3
#: the job user, made and removed here: a name of its own, for the tests' ``ocistage-slurm``
#: is made and removed by whichever test session runs at the same time
BENCH_USER = "ocistage-pyxbench"


@dataclass
class Run:
    image: str
    user: str
    case: str
    rep: int
    seconds: float
    ok: bool
    error: str = ""
    builds: int = 0
    requests: int = 0
    manifest_gets: int = 0
    blob_gets: int = 0
    #: per importer command on a node: (node, command, start, end, CPU seconds), times in
    #: seconds from srun's start
    imports: list[tuple[str, str, float, float, float]] = field(default_factory=list)

    @property
    def get_seconds(self) -> float:
        """The longest ``get`` of the step (the one the others wait for)."""
        gets = [i[3] - i[2] for i in self.imports if i[1] == "get"]
        return max(gets) if gets else float("nan")

    @property
    def importer_cpu(self) -> float:
        """CPU seconds of every importer command of the step (``get`` and ``release``)."""
        return sum(i[4] for i in self.imports)


def combined_image(files: int, megabytes: int) -> Path:
    """An OCI layout holding ``synthetic``: busybox's layers under the synthetic image's four
    (hard links to the cached blobs), made once per image size."""
    synthetic = build_synthetic(SynthSpec(files, megabytes * MB), ("gzip",))["gzip"]
    fixtures = fixture_layouts()
    busybox = fixtures.images["busybox"]
    layout = _Layout(cache_root() / "pyxisnodes-v1" / f"{files}-{megabytes}")
    layers = []
    sources = [(fixtures.layout, digest, diff_id)
               for digest, diff_id in zip(busybox.layer_digests, busybox.diff_ids, strict=True)]
    sources += [(synthetic.layout, digest, diff_id)
                for (digest, _compression), diff_id in zip(synthetic.layers, synthetic.diff_ids,
                                                          strict=True)]
    for source, digest, diff_id in sources:
        target = layout.blob(digest)
        if not target.exists():
            os.link(source / "blobs" / "sha256" / digest.split(":", 1)[1], target)
        layers.append((digest, diff_id, target.stat().st_size))
    add_image(layout, "synthetic", layers, "gzip", env_path="/bin:/usr/bin", cmd="/bin/true",
              history="ocistage bench pyxisnodes synthetic")
    return layout.path


def push_images(layout: Path, registry: str) -> None:
    """``synthetic`` from ``layout`` and the busybox fixture as ``bench/NAME:latest``."""
    sources = {"synthetic": f"oci:{layout}:synthetic",
               "busybox": fixture_layouts().oci_ref("busybox")}
    for name, source in sources.items():
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", source,
                        f"docker://{registry}/bench/{name}:latest"],
                       check=True, stdin=subprocess.DEVNULL, timeout=600)


@contextmanager
def timing_importer(importer: Path) -> Iterator[tuple[Path, Path]]:
    """(a wrapper of ``importer`` that logs ``NODE COMMAND START END CPU``, its log): wall
    times in epoch seconds, CPU as dash's ``times`` gives the importer's (user and system)."""
    base = Path(tempfile.mkdtemp(prefix="ocistage-bench-importer-", dir="/tmp"))
    try:
        base.chmod(0o1777)
        log = base / "imports.log"
        log.touch()
        log.chmod(0o666)
        wrapper = base / "ocistage-pyxis-importer"
        wrapper.write_text(
            f'#!/bin/sh\ns=$(date +%s.%N)\n{importer} "$@"\nrc=$?\ne=$(date +%s.%N)\n'
            f'times > {base}/times.$$; {{ read _; read cpu; }} < {base}/times.$$; '
            f'rm -f {base}/times.$$\n'
            f'echo "${{SLURMD_NODENAME:--}} $1 $s $e $cpu" >> {log}\nexit $rc\n')
        wrapper.chmod(0o755)
        yield wrapper, log
    finally:
        shutil.rmtree(base, ignore_errors=True)


def cpu_seconds(user: str, system: str) -> float:
    """dash's ``times`` fields (``0m0.170000s``) summed, in seconds."""
    total = 0.0
    for value in (user, system):
        minutes, _, seconds = value.rstrip("s").partition("m")
        total += 60 * float(minutes) + float(seconds)
    return total


@dataclass
class Bench:
    cluster: SlurmCluster
    proxy: FaultProxy
    tools: Path
    imports_log: Path
    work: Path
    users: dict[str, JobUser | None]
    runs: list[Run] = field(default_factory=list)
    made: int = 0

    def home(self, user: str) -> Path:
        """An empty store and cache of ``user``'s."""
        self.made += 1
        home = self.work / f"{self.made}-{user}"
        home.mkdir(mode=0o700)
        account = self.users[user]
        if account is not None:
            os.chown(home, account.uid, account.gid)
        return home

    def srun(self, rep: int, image: str, user: str, case: str, home: Path | None) -> Run:
        account = self.users[user]
        nodes = ["-N1"] if case.startswith("N1") else ["-N3", "--ntasks-per-node=1"]
        args = [*nodes]
        if home is not None:
            args += [job_export(home, account.uid if account else 0),
                     f"--container-image={self.proxy.host}#bench/{image}:latest"]
        builds = len(mksquashfs_builds(self.tools))
        self.proxy.clear()
        self.imports_log.write_text("")
        start_epoch = time.time()
        start = time.perf_counter()
        result = self.cluster.srun(*args, "true", user=account, cwd=Path("/tmp"), timeout=900)
        seconds = time.perf_counter() - start
        requests = self.proxy.requests
        imports = []
        for line in self.imports_log.read_text().splitlines():
            node, command, began, ended, user_cpu, system_cpu = line.split()
            imports.append((node, command, float(began) - start_epoch,
                            float(ended) - start_epoch, cpu_seconds(user_cpu, system_cpu)))
        run = Run(image, user, case, rep, seconds, result.returncode == 0,
                  (result.stderr + result.stdout).strip()[-600:] if result.returncode else "",
                  len(mksquashfs_builds(self.tools)) - builds, len(requests),
                  sum(1 for r in requests if r.method == "GET" and "/manifests/" in r.path),
                  sum(1 for r in requests if r.method == "GET" and "/blobs/" in r.path),
                  imports)
        self.runs.append(run)
        state = "ok" if run.ok else f"FAILED: {run.error.splitlines()[-1:]}"
        print(f"  rep {rep + 1} {image:9} {user:4} {case:8} {seconds:6.2f}s get "
              f"{run.get_seconds:5.2f}s importer CPU {run.importer_cpu:5.2f}s builds {run.builds} "
              f"requests {run.requests} {state}",
              flush=True)
        return run

    def cold_pair(self, rep: int, image: str, user: str) -> None:
        order = ("N1 cold", "N3 cold") if rep % 2 == 0 else ("N3 cold", "N1 cold")
        for case in order:
            home = self.home(user)
            self.srun(rep, image, user, case, home)
            self.srun(rep, image, user, case.replace("cold", "warm"), home)
            shutil.rmtree(home, ignore_errors=True)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(runs: list[Run]) -> list[dict[str, Any]]:
    """One row per image, user and case: medians over the good runs."""
    rows = []
    keys = sorted({(r.image, r.user, r.case) for r in runs},
                  key=lambda k: (IMAGES.index(k[0]) if k[0] in IMAGES else -1,
                                 USERS.index(k[1]), CASES.index(k[2])))
    for image, user, case in keys:
        group = [r for r in runs if (r.image, r.user, r.case) == (image, user, case)]
        good = [r for r in group if r.ok]
        rows.append({"image": image, "user": user, "case": case, "runs": len(group),
                     "failed": len(group) - len(good),
                     "seconds": _median([r.seconds for r in good]),
                     "min": min((r.seconds for r in good), default=float("nan")),
                     "max": max((r.seconds for r in good), default=float("nan")),
                     "get": _median([r.get_seconds for r in good]),
                     "importer_cpu": _median([r.importer_cpu for r in good]),
                     "builds": _median([float(r.builds) for r in good]),
                     "manifest_gets": _median([float(r.manifest_gets) for r in good]),
                     "blob_gets": _median([float(r.blob_gets) for r in good]),
                     "requests": _median([float(r.requests) for r in good])})
    return rows


PHASES = ("to get", "gets", "builder", "waiter lag", "pyxis", "releases", "release")


def phases(run: Run) -> dict[str, float] | None:
    """Where a container step's time went, from the importer's log (seconds): srun's start to
    the first ``get`` (srun, slurmd, pyxis); the ``get``s, first start to last end, the
    builder's (the ``get`` of the most CPU) and how long after it the last waiter ended; the
    last ``get``'s end to the first ``release`` (pyxis: mount, ``enroot start``, the command,
    teardown); the ``release``s, first start to last end, and one's mean. None without both."""
    gets = [i for i in run.imports if i[1] == "get"]
    releases = [i for i in run.imports if i[1] == "release"]
    if not gets or not releases:
        return None
    builder = max(gets, key=lambda i: i[4])
    last_get = max(i[3] for i in gets)
    first_release = min(i[2] for i in releases)
    return {"to get": min(i[2] for i in gets), "gets": last_get - min(i[2] for i in gets),
            "builder": builder[3] - builder[2], "waiter lag": last_get - builder[3],
            "pyxis": first_release - last_get,
            "releases": max(i[3] for i in releases) - first_release,
            "release": statistics.mean(i[3] - i[2] for i in releases)}


def render_phases(runs: list[Run]) -> str:
    """Medians of :func:`phases` per image, user and case, over the good runs."""
    lines = [f"{'image':10} {'user':5} {'case':9} " + " ".join(f"{p:>10}" for p in PHASES)]
    keys = sorted({(r.image, r.user, r.case) for r in runs if r.imports},
                  key=lambda k: (IMAGES.index(k[0]), USERS.index(k[1]), CASES.index(k[2])))
    for image, user, case in keys:
        found = [p for r in runs if r.ok and (r.image, r.user, r.case) == (image, user, case)
                 for p in [phases(r)] if p is not None]
        if found:
            lines.append(f"{image:10} {user:5} {case:9} " + " ".join(
                f"{_median([p[name] for p in found]):10.2f}" for name in PHASES))
    return "\n".join(lines)


def ratios(rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """N3 cold / N1 cold per (image, user)."""
    seconds = {(r["image"], r["user"], r["case"]): r["seconds"] for r in rows}
    return {(image, user): seconds[(image, user, "N3 cold")] / seconds[(image, user, "N1 cold")]
            for image, user, case in seconds
            if case == "N1 cold" and (image, user, "N3 cold") in seconds}


def render(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'image':10} {'user':5} {'case':9} {'median s':>9} {'min':>6} {'max':>6} "
             f"{'get s':>6} {'imp CPU':>7} {'builds':>6} {'man/blob GETs':>13} {'requests':>8}"]
    for r in rows:
        get = "" if r["get"] != r["get"] else f"{r['get']:.2f}"
        lines.append(f"{r['image']:10} {r['user']:5} {r['case']:9} {r['seconds']:9.2f} "
                     f"{r['min']:6.2f} {r['max']:6.2f} {get:>6} {r['importer_cpu']:7.2f} "
                     f"{r['builds']:6.0f} "
                     f"{r['manifest_gets']:>6.0f}/{r['blob_gets']:<6.0f} {r['requests']:8.0f}"
                     + (f"  ({r['failed']} of {r['runs']} failed)" if r["failed"] else ""))
    for (image, user), ratio in ratios(rows).items():
        verdict = "met" if ratio <= GOAL else "missed"
        lines.append(f"N3 cold / N1 cold, {image}, {user}: {ratio:.2f} (goal <= {GOAL}: "
                     f"{verdict})")
    return "\n".join(lines)


def measure(args: argparse.Namespace, stack: ExitStack) -> dict[str, Any]:
    images = [name for name in args.images.split(",") if name]
    users = [name for name in args.users.split(",") if name]
    layout = combined_image(args.files, args.megabytes)
    registry = stack.enter_context(running_registry(cache_root() / "pyxisnodes-registry"
                                                    / "storage"))
    push_images(layout, registry.host)
    proxy = stack.enter_context(running_fault_proxy(f"http://{registry.host}"))
    prefix = enroot_pyxis_prefix()
    importer = stack.enter_context(installed_importer())
    wrapper, imports_log = stack.enter_context(timing_importer(importer))
    tools = stack.enter_context(logging_mksquashfs())
    accounts: dict[str, JobUser | None] = {"root": None}
    if "user" in users:
        accounts["user"] = stack.enter_context(job_user_account(BENCH_USER))
    cluster = stack.enter_context(running_cluster(
        pyxis_spec("pyxisbench", prefix, wrapper, tools), ocistage_command()))
    work = Path(tempfile.mkdtemp(prefix="ocistage-bench-pyxisnodes-", dir="/tmp"))
    stack.callback(shutil.rmtree, work, True)
    work.chmod(0o755)
    bench = Bench(cluster, proxy, tools, imports_log, work, accounts)
    load = os.getloadavg()
    loads = [load]
    print(f"bench pyxisnodes: images {', '.join(images)}, users {', '.join(users)}, "
          f"{args.reps} reps, Slurm {cluster.version}, load {load[0]:.1f}", flush=True)
    for rep in range(args.reps):
        for case in (("N1 plain", "N3 plain") if rep % 2 == 0 else ("N3 plain", "N1 plain")):
            bench.srun(rep, "none", "root", case, None)
        for image in images:
            for user in (users if rep % 2 == 0 else list(reversed(users))):
                bench.cold_pair(rep, image, user)
        loads.append(os.getloadavg())
    return {"when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"), "reps": args.reps,
            "files": args.files, "megabytes": args.megabytes, "cpus": os.cpu_count(),
            "loads": loads, "page_cache_dropped": False,
            "runs": [asdict(run) for run in bench.runs]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench pyxisnodes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions [3]")
    parser.add_argument("--files", type=int, default=3000,
                        help="files of the synthetic image [3000]")
    parser.add_argument("--megabytes", type=int, default=100,
                        help="MB of files of the synthetic image [100]")
    parser.add_argument("--images", default=",".join(IMAGES), help=f"[{','.join(IMAGES)}]")
    parser.add_argument("--users", default=",".join(USERS),
                        help=f"root, and user: the job user {BENCH_USER} [root,user]")
    args = parser.parse_args(argv)
    if any(i not in IMAGES for i in args.images.split(",") if i) or any(
            u not in USERS for u in args.users.split(",") if u):
        parser.error(f"images are {', '.join(IMAGES)}; users {', '.join(USERS)}")
    if os.geteuid() != 0:
        print("bench pyxisnodes: needs root (it starts a Slurm cluster)", file=sys.stderr)
        return 2
    problem = check_spec(built_spec())
    missing = [t for t in ("docker-registry", "skopeo", "mksquashfs") if not shutil.which(t)]
    if problem is not None or missing:
        print(f"bench pyxisnodes: {problem or 'missing ' + ', '.join(missing)}",
              file=sys.stderr)
        return 2
    with ExitStack() as stack:
        try:
            result = measure(args, stack)
        except ClusterError as exc:
            print(f"bench pyxisnodes: {exc}", file=sys.stderr)
            return 2
    runs = [Run(**{**run, "imports": [tuple(i) for i in run["imports"]]})
            for run in result["runs"]]
    rows = summary(runs)
    result["summary"] = rows
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"pyxisnodes-{result['when']}.json"
    out.write_text(json.dumps(result, indent=2))
    print(render(rows))
    print("phases, medians in seconds (bench/pyxisnodes.py, phases()):")
    print(render_phases(runs))
    loads = result["loads"]
    print(f"load (1 min) during the run: {min(x[0] for x in loads):.1f} to "
          f"{max(x[0] for x in loads):.1f} on {result['cpus']} CPUs")
    print(f"bench pyxisnodes: raw runs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

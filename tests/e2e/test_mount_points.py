"""A bundle started by many runtimes at once, as ``srun -N3 --container=BUNDLE`` does on a shared
filesystem: an image built ``FROM scratch`` has no ``/proc``, ``/dev`` or ``/sys``, and runtimes
that each made them at start raced (crun: ``cannot mkdir `proc`: File exists``; eight cruns
started at once on fresh such bundles, 40 rounds, lost it in 3 of 4 runs of the test below).
ocistage makes them when it builds the bundle (:mod:`ocistage.bundler.rootfsmounts`)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pytest_ocistage import busybox_layer
from pytest_ocistage.bundles import BundleRun, run_bundle
from pytest_ocistage.plugin import ImageFactory
from pytest_ocistage.runner import OcistageRunner

STARTS = 8
ROUNDS = 40  # fresh bundles, each started STARTS times at once


def scratch_image(oci_image: ImageFactory) -> str:
    layer = busybox_layer()
    assert not {"proc", "dev", "sys"} & {name.split("/")[0] for name in layer}
    return oci_image(layer, entrypoint=["/bin/sh", "-c"],
                     cmd=["test -r /proc/self/status && test -d /sys/kernel && echo ok"]).ref


def start_at_once(bundle: Path, state: Path, runtime: str) -> None:
    assert {"proc", "dev", "sys"} <= set(os.listdir(bundle / "rootfs"))

    def start(n: int) -> BundleRun:
        return run_bundle(bundle, state / str(n), runtime)

    with ThreadPoolExecutor(STARTS) as pool:
        runs = list(pool.map(start, range(STARTS)))
    assert [(run.returncode, run.stdout) for run in runs] == [(0, "ok\n")] * STARTS, \
        [run.stderr for run in runs]


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_cached_bundle_of_a_scratch_image_starts_many_times_at_once(
        oci_image: ImageFactory, ocistage: OcistageRunner, tmp_path: Path, runtime: str) -> None:
    bundle = Path(ocistage("bundle", scratch_image(oci_image), check=True).stdout.strip())
    start_at_once(bundle, tmp_path / "state", runtime)


def test_fresh_bundles_of_a_scratch_image_start_many_times_at_once_under_crun(
        oci_image: ImageFactory, ocistage: OcistageRunner, tmp_path: Path) -> None:
    ref = scratch_image(oci_image)
    for n in range(ROUNDS):  # a runtime that made a mount point settles the race for the next
        bundle = tmp_path / f"bundle-{n}"
        ocistage("bundle", ref, str(bundle), check=True)
        start_at_once(bundle, tmp_path / f"state-{n}", "crun")

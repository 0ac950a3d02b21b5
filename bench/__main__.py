"""``python -m bench [goals|bundle|stage|slurm|...] [options]``: the benchmarks of ocistage
(see bench/README.md).

``goals`` (the default: ``python -m bench`` alone, or ``python -m bench --quick``) runs every
goal of DESIGN.md's Performance section this machine can measure and prints one table of
them (``bench/goals.py``); ``squashfs`` measures mksquashfs block sizes and compressors
(``bench/squashfs.py``). ``bundle`` (the default before ``goals``; still the one options
without a subcommand go to) compares cold/warm ``ocistage bundle`` with ``skopeo copy`` +
``umoci unpack --rootless``, podman and the floor (``curl | tee blob | tee >(sha256sum) |
gzip -dc | tee >(sha256sum) | tar -x``, bench/floor.py); ``stage`` runs
``bench/stage.py`` (staging vs ``rsync -a`` and, for re-stages, ``rsync --link-dest`` plus
removing the old tree) when that module is present; ``scale`` times
cold bundles and first stages of synthetic images from 1k to 300k files and 100 MB to 10 GB
(``bench/scale.py``); ``slurm`` stages on 1 and 3 nodes of the Slurm 24.05 test cluster
(``bench/slurm.py``); ``pyxis`` times ``ocistage-pyxis-importer get`` (cold and warm) against
``enroot import`` of the same image (``bench/pyxis.py``); ``pyxislevels`` the cold ``get`` at
each squashfs compression, with and without ``pyxis_squashfs_only``, against ``enroot import``
(``bench/pyxislevels.py``); ``pyxisphases`` where a cold ``get`` and ``enroot import``
spend their time, phase by phase (``bench/pyxisphases.py``); ``pyxisnodes`` runs ``srun
--container-image`` on 1 and on 3 nodes at once through the real pyxis cluster
(``bench/pyxisnodes.py``); ``mounts`` reads a staged squashfs
image through squashfuse_ll, squashfuse and the kernel (``bench/mounts.py``); ``metaops``
counts the metadata system calls of a 1%-changed re-stage against rsync's
(``bench/metaops.py``); ``trust`` times a warm bundle under one ``signedBy`` scope against an
accept-anything policy (``bench/trust.py``); ``warm`` times G4's ``--version`` and warm
bundles of one or more checkouts side by side, wall and CPU (``bench/warm.py``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from bench.bundle import DEFAULT_IMAGES, synthetic_spec
from bench.bundle import main as bundle_main
from bench.images import SPECS


def compile_ocistage() -> None:
    """Byte-compile ocistage's packages, as an installed package is: with
    ``PYTHONDONTWRITEBYTECODE`` set (or a checkout never imported) every ``ocistage`` process
    would compile its modules from source, ~80 ms a command line here."""
    import compileall
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for package in ("bundler", "cache", "stagers", "runtimes"):
        compileall.compile_dir(root / package, quiet=1)


def main(argv: list[str]) -> int:
    compile_ocistage()
    if not argv or argv[0] == "goals" or argv == ["--quick"]:
        from bench.goals import main as goals_main

        return goals_main(argv[1:] if argv and argv[0] == "goals" else argv)
    if argv and argv[0] == "slurm":
        from bench.slurm import main as slurm_main

        return slurm_main(argv[1:])
    if argv and argv[0] == "squashfs":
        from bench.squashfs import main as squashfs_main

        return squashfs_main(argv[1:])
    if argv and argv[0] == "metaops":
        from bench.metaops import main as metaops_main

        return metaops_main(argv[1:])
    if argv and argv[0] == "mounts":
        from bench.mounts import main as mounts_main

        return mounts_main(argv[1:])
    if argv and argv[0] == "warm":
        from bench.warm import main as warm_main

        return warm_main(argv[1:])
    if argv and argv[0] == "trust":
        from bench.trust import main as trust_main

        return trust_main(argv[1:])
    if argv and argv[0] == "pyxis":
        from bench.pyxis import main as pyxis_main

        return pyxis_main(argv[1:])
    if argv and argv[0] == "pyxislevels":
        from bench.pyxislevels import main as pyxislevels_main

        return pyxislevels_main(argv[1:])
    if argv and argv[0] == "pyxisphases":
        from bench.pyxisphases import main as pyxisphases_main

        return pyxisphases_main(argv[1:])
    if argv and argv[0] == "pyxisnodes":
        from bench.pyxisnodes import main as pyxisnodes_main

        return pyxisnodes_main(argv[1:])
    if argv and argv[0] == "scale":
        from bench.scale import main as scale_main

        return scale_main(argv[1:])
    if argv and argv[0] == "stage":
        try:
            stage = importlib.import_module("bench.stage")
        except ModuleNotFoundError:
            print("bench: bench/stage.py is not there yet", file=sys.stderr)
            return 1
        result: int = stage.main(argv[1:])
        return result
    if argv and argv[0] == "bundle":
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="python -m bench bundle", description=__doc__)
    parser.add_argument("--images", default=",".join(DEFAULT_IMAGES),
                        help=f"comma-separated, from {', '.join(SPECS)}, or a synthetic "
                             "image scale-<files>f-<MB>m-<gzip|zstd> (bench/synthetic.py; "
                             "e.g. scale-30000f-1024m-gzip) "
                             f"[default: {','.join(DEFAULT_IMAGES)}]")
    parser.add_argument("--only", metavar="RUNS",
                        help="comma-separated subset of the runs (e.g. 'ocistage,floor,"
                             "floor-nv,DEST from snap,cp -a') [default: all]")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per tool [3]")
    parser.add_argument("--keep-page-cache", action="store_true",
                        help="do not drop the page cache before cold runs (it is dropped when "
                             "allowed: root, /proc/sys/vm/drop_caches writable)")
    args = parser.parse_args(argv)
    names = [name for name in args.images.split(",") if name]
    unknown = [name for name in names if name not in SPECS and synthetic_spec(name) is None]
    if unknown:
        parser.error(f"unknown images: {', '.join(unknown)}")
    only = frozenset(args.only.split(",")) if args.only else None
    return bundle_main(names, max(1, args.reps), drop=not args.keep_page_cache, only=only)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``submit_image()``: the library call behind ``ocistage submit``: bundle a REF, then submit it.

The REF is bundled into the cache (:func:`bundle_for_submit`,
:func:`ocistage.bundler.flows.bundle.make_bundle`), then staged where the job runs and handed to
Slurm by :func:`submit_bundle` (:func:`ocistage.runtimes.submit.submit`: a held
``sbatch --container``, its lease, the ``afterany`` cleanup job; or ``srun --container``).

``runtimes`` knows nothing of registries: a REF must become a bundle before it can be
submitted, so the bundling happens here, above both (docs/architecture.md, "Layers"), as
``bundler/flows/stage.py`` bundles a REF before ``stagers`` stage it."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ocistage.bundler.flows.bundle import BundleResult
    from ocistage.bundler.image.reference import ImageSource
    from ocistage.bundler.pull import PullOptions, PullProgress
    from ocistage.cache.leases import InUse
    from ocistage.cache.notice import Notice
    from ocistage.cache.store import Store
    from ocistage.results import Renderer
    from ocistage.runtimes.submit import SubmitOptions, SubmitResult

#: a URL (``memory://x``; ``Path`` would have made it ``memory:/x``)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/")


@dataclass(frozen=True)
class Submitted:
    bundle: Path                   # the bundle in the cache that was staged
    result: SubmitResult
    warnings: tuple[Notice, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """What ``submit --json`` prints."""
        result = self.result
        return {"job_id": result.job_id, "staged": str(result.staged),
                "lease_id": result.lease_id, "exit_code": result.exit_code,
                "cleanup_job_id": result.cleanup_job_id, "bundle": str(self.bundle)}

    def render(self, out: Renderer) -> None:
        """The job id (none for --srun, whose job ran already)."""
        if self.result.job_id is not None:
            out.note(f"staged {self.result.staged}")
            out.line(self.result.job_id)


def check_stage_target(target: str) -> Path:
    """``submit`` stages into a directory the nodes see: never a URL."""
    if _URL.match(target):
        raise UsageError(f"submit stages into a directory the nodes see, not {target}",
                         "pass --stage-to DIR")
    return Path(target).absolute()


def bundle_for_submit(source: ImageSource, options: SubmitOptions, *, store: Store,
                      pull_options: PullOptions, in_use: InUse, map_root: bool = False,
                      progress: PullProgress | None = None) -> BundleResult:
    """The bundle ``submit`` hands to Slurm: ``source`` bundled into the cache (with the
    caller's values where ``--host-env`` asks for them), kept from GC by ``in_use`` until
    :func:`submit_bundle` has staged it. Its warnings are the caller's to show before
    :func:`submit_bundle` runs the job (an ``srun`` job writes to the same terminal)."""
    from ocistage.bundler.configoptions import ConfigOptions
    from ocistage.bundler.flows.bundle import make_bundle
    from ocistage.runtimes.submit import check_options, host_overrides

    check_options(options.options)  # before anything is pulled
    bundle = make_bundle(source, store, pull_options=pull_options, in_use=in_use,
                         config_options=ConfigOptions(map_root=map_root), progress=progress)
    overrides = [] if options.image_env else host_overrides(bundle.path)
    if overrides:  # --host-env: the caller's values in config.json too (24.05+ prefer it)
        bundle = make_bundle(source, store, pull_options=pull_options, in_use=in_use,
                             config_options=ConfigOptions(map_root=map_root, env=overrides),
                             progress=progress)
    return dataclasses.replace(bundle, warnings=(*bundle.warnings,
                                                 *slurm_notices(bundle.path, options.options)))


def slurm_notices(bundle: Path, options: Sequence[str] = ()) -> tuple[Notice, ...]:
    """What keeps Slurm's runc from running ``bundle`` for the caller (the check ``bundle``
    makes for runc run here, :func:`ocistage.runtimes.userrun.slurm_run_notices`)."""
    from ocistage.cache.jsondoc import parse_json, read_document
    from ocistage.errors import OcistageError
    from ocistage.runtimes.pmix_ids import mpi_notices
    from ocistage.runtimes.userrun import slurm_run_notices

    try:
        config = parse_json(read_document(bundle / "config.json", owners="ours"))
    except (OSError, ValueError, OcistageError):
        return ()
    if not isinstance(config, dict):
        return ()
    return (*slurm_run_notices(config), *mpi_notices(config, options))


def submit_bundle(bundle: BundleResult, options: SubmitOptions, *, store: Store) -> Submitted:
    """Stage ``bundle`` and hand it to Slurm as ``options`` say (module docstring)."""
    from ocistage.runtimes.submit import submit

    result = submit(bundle.path, options, cache_root=store.root)
    return Submitted(bundle.path, result, tuple(bundle.warnings))


def submit_image(source: ImageSource, options: SubmitOptions, *, store: Store,
                 pull_options: PullOptions, map_root: bool = False,
                 progress: PullProgress | None = None) -> Submitted:
    """Bundle ``source`` and submit it as ``options`` say: :func:`bundle_for_submit`, then
    :func:`submit_bundle` (the command line shows the warnings between the two)."""
    from ocistage.cache.leases import InUse

    with InUse(store.root) as in_use:
        bundle = bundle_for_submit(source, options, store=store, pull_options=pull_options,
                                   in_use=in_use, map_root=map_root, progress=progress)
        return submit_bundle(bundle, options, store=store)

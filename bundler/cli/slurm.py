"""`ocistage runtime ...`, `ocistage scrun ...` and `ocistage submit`: the Slurm hand-off."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from ocistage.bundler.cli.commands import FullSummaryGroup
from ocistage.bundler.cli.common import (
    STAGING,
    CommonOptions,
    RefArg,
    complete_words,
    examples,
    print_json_line,
    print_warnings,
    stderr,
    stdout,
    with_options,
)

# light modules whose constants the options show; the rest is imported inside the commands
# (see ocistage.bundler.cli.common)
from ocistage.runtimes.oci_conf import RUNTIMES

if TYPE_CHECKING:
    from ocistage.runtimes.slurm import SlurmVersion

# the commands' typer apps, built when their command runs (ocistage.bundler.cli.commands)
runtime_app = typer.Typer(help="Generate Slurm runtime configuration (oci.conf, scrun.lua).",
    rich_markup_mode=None, no_args_is_help=True, add_completion=False, cls=FullSummaryGroup)
scrun_app = typer.Typer(help="Entry points called by the scrun.lua stage hooks.",
    rich_markup_mode=None, no_args_is_help=True, add_completion=False, cls=FullSummaryGroup)
submit_app = typer.Typer(rich_markup_mode=None, add_completion=False)

SlurmVersionOpt = Annotated[str | None, typer.Option(
    "--slurm-version", metavar="X.Y",
    help="Generate for this Slurm release [default: the installed one, `scontrol --version`].")]
StageToOpt = Annotated[str, typer.Option(
    "--stage-to", metavar="shared|node-local",
    autocompletion=complete_words("shared", "node-local"),
    help="shared: stage on the submit host into a directory every node sees; node-local: "
         "stage on the job's node (slurm.remote_command).")]
ScrunOpt = Annotated[str | None, typer.Option(
    "--scrun", metavar="PATH", help="Path of scrun [default: the scrun on PATH].")]


def _slurm_version(text: str | None) -> SlurmVersion:
    from ocistage.runtimes.slurm import SlurmVersion, installed_version

    return SlurmVersion.parse(text) if text else installed_version()


# -- oci.conf ----------------------------------------------------------------------------------


@runtime_app.command("oci-conf")
def runtime_oci_conf(
    runtime: Annotated[str, typer.Option(
        "--runtime", metavar="|".join(RUNTIMES), autocompletion=complete_words(*RUNTIMES),
        help="The OCI runtime slurmstepd calls.")
    ] = "runc",
    mode: Annotated[str, typer.Option(
        "--mode", metavar="run",
        help="run: one RunTimeRun call, the only mode slurmstepd runs correctly (create/start "
             "hangs with runc and crun and loses the exit status: refused, see docs/slurm.md).")
    ] = "run",
    root: Annotated[str | None, typer.Option(
        "--root", metavar="DIR",
        help="Runtime state directory (may use Slurm patterns) [default: "
             "/run/user/UID/ocistage-RUNTIME].")] = None,
    slurm_version: SlurmVersionOpt = None,
    check: Annotated[Path | None, typer.Option(
        "--check", metavar="FILE",
        help="Lint FILE instead: one line per problem, exit 1 if there are any.")] = None,
    slurm_conf: Annotated[Path | None, typer.Option(
        "--slurm-conf", metavar="FILE",
        help="With --check: lint FILE's settings that changed name between releases too "
             "(JobContainerType/NamespaceType).")] = None,
) -> None:
    """Print an oci.conf for Slurm for a given runtime (runc, crun, nvidia, ...)."""
    from ocistage.runtimes.oci_conf import lint_oci_conf_file, oci_conf_options, render_oci_conf

    version = _slurm_version(slurm_version)
    if check is not None:
        _print_problems(check, lint_oci_conf_file(check, version), slurm_conf, version)
        return
    text = render_oci_conf(oci_conf_options(runtime, mode, root, version))
    stdout.print(text, end="", markup=False)


def _print_problems(check: Path, problems: list[Any], slurm_conf: Path | None,
                    version: SlurmVersion) -> None:
    """Print ``check``'s problems and those of ``slurm_conf``; exit 1 if there are any."""
    from ocistage.runtimes.oci_conf import lint_slurm_conf

    found = [(check, problem) for problem in problems]
    if slurm_conf is not None:
        try:
            text = slurm_conf.read_text(errors="replace")
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {slurm_conf}: {exc.strerror}") from exc
        found += [(slurm_conf, problem) for problem in lint_slurm_conf(text, version)]
    for path, problem in found:
        stdout.print(f"{path}: {problem}", markup=False)
    if found:
        raise typer.Exit(1)


# -- scrun.lua and engine snippets -------------------------------------------------------------


@runtime_app.command("scrun-lua")
def runtime_scrun_lua(
    stage_to: StageToOpt = "shared",
    stage_dir: Annotated[str | None, typer.Option(
        "--stage-dir", metavar="DIR", show_default=False,
        help="Where staged bundles go (per user: DIR/UID/); on a shared filesystem for "
             "--stage-to shared [default: /tmp/ocistage-scrun; for node-local "
             "/var/tmp/ocistage-scrun, which no job namespace makes private].")] = None,
    ocistage: Annotated[str | None, typer.Option(
        "--ocistage", metavar="PATH",
        help="Absolute path of the ocistage command as the nodes see it [default: this "
             "ocistage, as `PYTHON -P -m ocistage` by absolute path].")] = None,
    cache: Annotated[str | None, typer.Option(
        "--cache", metavar="DIR",
        help="Cache (leases) the hooks use [default: each user's own].")] = None,
    sbatch: Annotated[str | None, typer.Option(
        "--sbatch", metavar="PATH",
        help="The sbatch that queues each staged bundle's cleanup job (it removes the bundle "
             "after the job, also after scrun kill) [default: the sbatch on PATH].")] = None,
    cleanup_job: Annotated[bool, typer.Option(
        "--cleanup-job/--no-cleanup-job",
        help="Queue a cleanup job per staged bundle (docs/slurm.md).")] = True,
    slurm_version: SlurmVersionOpt = None,
) -> None:
    """Print a scrun.lua whose stage hooks call `ocistage scrun ...`."""
    from ocistage.runtimes.oci_conf import per_job_dir
    from ocistage.runtimes.scrun_lua import default_stage_dir, render_scrun_lua, scrun_lua_options

    version = _slurm_version(slurm_version)
    if stage_dir is None:
        stage_dir = default_stage_dir(stage_to)
    options = scrun_lua_options(ocistage=ocistage, stage_to=stage_to,
                                stage_dir=stage_dir, cache=cache,
                                sbatch=sbatch if cleanup_job else None,
                                find_sbatch=cleanup_job, version=version)
    private = per_job_dir(stage_dir, version) if stage_to == "node-local" else None
    if private is not None:
        stderr.print(f"warning: --stage-dir {stage_dir} is in {private}, which Slurm "
                     f"{version}'s NamespaceType=namespace/linux or namespace/tmpfs makes "
                     "private to each job: choose a node-local directory outside /tmp and "
                     "/dev/shm", markup=False)
    stdout.print(render_scrun_lua(options), end="", markup=False)


@runtime_app.command("docker-config")
def runtime_docker_config(scrun: ScrunOpt = None) -> None:
    """Print ~/.config/docker/daemon.json for rootless Docker with scrun as its runtime."""
    from ocistage.runtimes.engines import docker_daemon_json, docker_run_flags, find_scrun

    stdout.print(docker_daemon_json(find_scrun(scrun)), end="", markup=False)
    stderr.print("# also pass to docker run: " + " ".join(docker_run_flags()), markup=False)


@runtime_app.command("podman-config")
def runtime_podman_config(scrun: ScrunOpt = None) -> None:
    """Print ~/.config/containers/containers.conf for rootless Podman with scrun."""
    from ocistage.runtimes.engines import find_scrun, podman_containers_conf

    stdout.print(podman_containers_conf(find_scrun(scrun)), end="", markup=False)
    if os.environ.get("SLURM_CONF"):
        stderr.print(f"# warning: SLURM_CONF={os.environ['SLURM_CONF']} does not reach scrun: "
                     "Podman runs it with XDG_RUNTIME_DIR and PATH only, so scrun reads "
                     "Slurm's default slurm.conf (or the configless one); see docs/slurm.md",
                     markup=False)


# -- scrun stage hooks -------------------------------------------------------------------------


@scrun_app.command("stage-in")
@with_options("cache", "verbose")
def scrun_stage_in(
    container_id: Annotated[str, typer.Option("--id", help="Container id from scrun.")],
    bundle: Annotated[Path, typer.Option("--bundle", help="The engine's bundle directory.")],
    stage_dir: Annotated[Path, typer.Option("--stage-dir", help="Staging directory.")],
    config: Annotated[Path | None, typer.Option(
        "--config", help="The bundle's config.json [default: BUNDLE/config.json].")] = None,
    job_id: Annotated[str | None, typer.Option("--job-id", help="Slurm job id.")] = None,
    uid: Annotated[int | None, typer.Option(
        "--uid", help="Job user id (as scrun sees it). An unprivileged caller stages for "
                      "itself: its uid, the host's id for it or 0 (what a rootless engine "
                      "maps it to); another user's is refused.")] = None,
    gid: Annotated[int | None, typer.Option(
        "--gid", help="Job group id (for an unprivileged caller: its own, as --uid).")
    ] = None,
    env_file: Annotated[Path | None, typer.Option(
        "--env-file", help="JSON list of the job's NAME=value variables.")] = None,
    stage_to: StageToOpt = "shared",
    link: Annotated[bool, typer.Option(
        "--link", help="Share inodes with the source/pool; the root becomes read-only.")
    ] = False,
    sbatch: Annotated[str | None, typer.Option(
        "--sbatch", metavar="PATH",
        help="Queue the bundle's cleanup job with this sbatch (after --job-id ends).")] = None,
    *,
    opts: CommonOptions,
) -> None:
    """Stage-in entry point called by scrun.lua; prints one JSON line."""
    from ocistage.runtimes.scrun import StageInRequest, stage_in
    from ocistage.runtimes.scrun_config import read_job_env

    # node-local: the cleanup job must run on this node (srun sets SLURMD_NODENAME)
    node = os.environ.get("SLURMD_NODENAME") if stage_to == "node-local" else None
    request = StageInRequest(
        container_id=container_id, bundle=bundle.absolute(),
        config_file=(config or bundle / "config.json").absolute(),
        stage_dir=stage_dir.absolute(), job_id=job_id or None,
        uid=uid, gid=gid,
        job_env=read_job_env(env_file), link=link, sbatch=sbatch,
        stage_to="node-local" if stage_to == "node-local" else "shared", node=node)
    print_json_line(stage_in(request, cache_root=opts.settings().cache))


@scrun_app.command("stage-out")
@with_options("cache", "verbose")
def scrun_stage_out(
    bundle: Annotated[Path, typer.Option("--bundle", help="The staged bundle to remove.")],
    root_path: Annotated[str | None, typer.Option(
        "--root-path", help="Its root path (as scrun passes it; informational).")] = None,
    *,
    opts: CommonOptions,
) -> None:
    """Stage-out entry point called by scrun.lua; prints one JSON line."""
    from ocistage.runtimes.scrun import StagedOut, stage_out

    removed = stage_out(bundle, cache_root=opts.settings().cache)
    print_json_line(StagedOut(bundle, root_path, removed))


# -- submit ------------------------------------------------------------------------------------


#: where the job's command (what follows ``--``) is kept for submit_command
_COMMAND = "ocistage.command"


class _CommandAfterDashes(TyperCommand):
    """``REF [SBATCH OPTS] -- CMD...``: what follows the first ``--`` is the job's command,
    taken off before click parses the rest (click would merge it into the unknown options)."""

    # ctx: click's Context (vendored as typer._click by typer 0.28, the click package before)
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        at = args.index("--") if "--" in args else len(args)
        ctx.meta[_COMMAND] = args[at + 1:]
        return super().parse_args(ctx, args[:at])

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage line: ``ocistage submit [OPTIONS] REF [SBATCH OPTS] -- CMD...``."""
        return [*super().collect_usage_pieces(ctx), "[SBATCH OPTS] -- CMD..."]


@submit_app.command("submit", cls=_CommandAfterDashes, epilog=examples(
    "ocistage submit registry.site:5000/team/app:1.2 -N 2 -t 1:00:00 -- python3 train.py",
    "ocistage submit --srun docker://debian:bookworm -p debug -- cat /etc/os-release"),
                    context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@with_options(*STAGING)
def submit_command(
    ref: RefArg,
    ctx: typer.Context,
    stage_to: Annotated[Path | None, typer.Option(
        "--stage-to", metavar="DIR", envvar="OCISTAGE_STAGE_TO",
        help="Staging directory that the compute nodes see [default: the stage_to setting, "
             "as for `stage`].")
    ] = None,
    srun: Annotated[bool, typer.Option(
        "--srun", help="Run blocking with srun (interactive) instead of sbatch.")] = False,
    copy: Annotated[bool, typer.Option(
        "--copy", help="Stage a private writable copy (default: shared, read-only root).")
    ] = False,
    map_root: Annotated[bool, typer.Option(
        "--map-root", help="Run as root inside the container, mapped to you (runc 1.1 "
                           "under Slurm needs it when neither you nor the image user is "
                           "root; see docs/slurm.md).")] = False,
    host_env: Annotated[bool, typer.Option(
        "--host-env", help="Run with your environment's PATH, HOME, ... where the image sets "
                           "them too (default: the image's, on every Slurm release).")] = False,
    *,
    opts: CommonOptions,
) -> None:
    """Pull, bundle and stage REF, then sbatch --container it.

    The options between REF and -- go to sbatch (or srun with --srun), the words after --
    are the job's command; a cleanup job removes the staged bundle after the job.
    """
    from ocistage.bundler.flows.submit import bundle_for_submit, check_stage_target, submit_bundle
    from ocistage.runtimes.submit import SubmitOptions, check_options, this_ocistage

    check_options(ctx.args)  # part of parsing: the sbatch options passed through
    settings = opts.settings()
    options = SubmitOptions(
        stage_to=check_stage_target(  # the same default as `stage`
            settings.stage_target(os.fspath(stage_to) if stage_to else None)),
        options=list(ctx.args), command=ctx.meta.get(_COMMAND, []), srun=srun, copy=copy,
        ocistage=this_ocistage(), image_env=not host_env)
    source, store, pulling = opts.image_inputs(ref, settings)
    from ocistage.cache.leases import InUse

    with InUse(store.root) as in_use:  # the cached bundle kept from GC until it is staged
        with opts.progress() as progress:
            bundle = bundle_for_submit(source, options, store=store, pull_options=pulling,
                                       in_use=in_use, map_root=map_root, progress=progress)
        # before the job: an srun job writes to this terminal, and its output would come first
        print_warnings(bundle.warnings, opts.quiet)
        sys.stderr.flush()
        submitted = submit_bundle(bundle, options, store=store)
    opts.emit(submitted, rich=True)
    if submitted.result.exit_code:
        raise typer.Exit(submitted.result.exit_code)

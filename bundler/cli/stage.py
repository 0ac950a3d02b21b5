"""`ocistage stage` and `ocistage unstage`: parse options, call stagers, render results."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ocistage.bundler.cli.common import (
    CacheOpt,
    CaFileOpt,
    InsecureOpt,
    JsonOpt,
    MirrorOpt,
    PlatformOpt,
    PullOpt,
    QuietOpt,
    VerboseOpt,
    console,
    download_progress,
    echo,
    is_terminal,
    load_cli_settings,
    open_store,
    print_json,
    print_warnings,
    pull_options,
    setup_logging,
)
from ocistage.cache.sizes import format_size

if TYPE_CHECKING:
    from ocistage.bundler.staging import Staged
    from ocistage.stagers.target import StageResult

# The stagers, the cache, the bundler and their dependencies are imported inside the commands:
# every `ocistage` invocation imports this module, few of them stage (see
# ocistage.bundler.cli.common).


# the commands' typer apps, built when their command runs (ocistage.bundler.cli.commands)
stage_app = typer.Typer(rich_markup_mode=None, add_completion=False)
unstage_app = typer.Typer(rich_markup_mode=None, add_completion=False)


def _result_json(result: StageResult, source: str) -> dict[str, Any]:
    from ocistage.stagers.allnodes import node_name

    return {"path": str(result.path), "source": source, "node": node_name(),
            "method": result.method, "files": result.files, "copied": result.copied,
            "linked": result.linked, "unchanged": result.unchanged,
            "bytes_copied": result.bytes_copied, "lease_id": result.lease_id}


@stage_app.command("stage")
def stage_command(
    what: Annotated[str, typer.Argument(
        metavar="REF|BUNDLE|DIR|URL",
        help="A bundle directory (has config.json), any directory tree, a squashfs image URL "
             "(file://, memory://, sftp://, s3://...), or an image reference that names its "
             "registry or transport (docker.io/library/alpine, localhost:5000/app, "
             "docker://alpine, oci:DIR), bundled first. Anything that looks like a path is a "
             "path, and a bare name such as `mybundle` that is no directory here is an error "
             "(no registry is guessed).")],
    to: Annotated[str | None, typer.Option(
        "--to", metavar="TARGET",
        help="Directory to stage into (shared or node-local), or an fsspec URL to store a "
             "squashfs image (--format squashfs) or a tar archive (--format dir) at "
             "[default: $OCISTAGE_STAGE_TO, else stage_to in the config file].")] = None,
    format: Annotated[str, typer.Option(
        "--format", metavar="dir|squashfs",
        help="dir: a directory bundle; squashfs: an image, mounted with squashfuse or "
             "unpacked.")] = "dir",
    name: Annotated[str | None, typer.Option(
        "--name", help="Name of the staged bundle under TARGET [default: the source's "
                       "directory name, e.g. the cache bundle key].")] = None,
    pin: Annotated[str | None, typer.Option(
        "--pin", metavar="NAME",
        help="Hold the staged bundle with this pin (until `ocistage unstage --pin NAME`) "
             "[default: the Slurm job inside a job, else the pin stage:USER].")] = None,
    all_nodes: Annotated[bool, typer.Option(
        "--all-nodes", help="Inside a Slurm job: stage on every node of the allocation "
                            "(srun, one task per node).")] = False,
    link: Annotated[bool | None, typer.Option(
        "--link/--copy",
        help="--link: insist on hardlinks from the source; --copy: independent copies "
             "[default: hardlinks or the target's pool where possible].")] = None,
    mount: Annotated[bool | None, typer.Option(
        "--mount/--unpack", help="squashfs: insist on mounting, or always unpack "
                                 "[default: mount where FUSE works, else unpack].")] = None,
    jobs: Annotated[int, typer.Option(
        "--jobs", "-j", min=1, max=64, help="Parallel file operations.")] = 8,
    json_lines: Annotated[bool, typer.Option("--json-lines", hidden=True)] = False,
    cache: CacheOpt = None,
    platform: PlatformOpt = None,
    insecure_registry: InsecureOpt = None,
    mirror: MirrorOpt = None,
    ca_file: CaFileOpt = None,
    pull_policy: PullOpt = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Stage a bundle onto a shared or node-local target; print the staged path."""
    setup_logging(verbose)
    from ocistage.bundler.staging import StageOptions, stage

    settings = load_cli_settings(cache=cache, insecure=insecure_registry, mirror=mirror,
                                 ca_file=ca_file, pull=pull_policy)
    to = settings.stage_target(to)
    silent = quiet or json_output or json_lines
    with _image_progress(silent or format != "squashfs") as image_progress:
        staged = stage(what, StageOptions(to=to, format=format, name=name, pin=pin,
                                          all_nodes=all_nodes, link=link, mount=mount,
                                          jobs=jobs),
                       store=open_store(settings),
                       pull_options=lambda: pull_options(settings, platform),
                       progress=lambda: download_progress(silent),
                       image_progress=image_progress)
    print_warnings(staged.warnings, quiet)
    _render(staged, json_output, json_lines, quiet)


@contextlib.contextmanager
def _image_progress(silent: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr while a squashfs image is built, on a terminal only."""
    if silent or not is_terminal():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("building squashfs image"), BarColumn(), MofNCompleteColumn(),
                  console=console(), transient=True) as bars:
        task = bars.add_task("image", total=None)

        def update(done: int, total: int) -> None:
            bars.update(task, completed=done, total=total)

        yield update


def _render(staged: Staged, json_output: bool, json_lines: bool, quiet: bool) -> None:
    from ocistage.stagers.target import (
        StageResult,  # (ocistage.stagers.remote's PushResult: not loaded here)
    )

    outcome = staged.outcome
    if isinstance(outcome, list):  # --all-nodes: one result per node
        if json_output:
            print_json([r.result for r in outcome])
            return
        for r in outcome:
            echo(f"{r.node}: {r.result.get('path')}")
        return
    if not isinstance(outcome, StageResult):  # stored at a URL (a PushResult)
        if json_output or json_lines:
            _emit({"url": outcome.url, "format": outcome.format, "size": outcome.size},
                  json_lines)
            return
        echo(outcome.url)
        return
    if json_output or json_lines:
        _emit(_result_json(outcome, staged.label), json_lines)
        return
    if not quiet:
        echo(f"staged {staged.label} ({outcome.method}: {outcome.files} files, "
             f"{outcome.copied} copied ({format_size(outcome.bytes_copied)}), "
             f"{outcome.linked} linked, {outcome.unchanged} unchanged)", err=True)
    echo(str(outcome.path))


def _emit(doc: dict[str, Any], one_line: bool) -> None:
    if one_line:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        print_json(doc)


@unstage_app.command("unstage")
def unstage_command(
    path: Annotated[Path, typer.Argument(
        metavar="PATH", help="The path `ocistage stage` printed.")],
    pin: Annotated[str | None, typer.Option(
        "--pin", metavar="NAME", help="Release only this pin's lease; keep the bundle while "
                                      "other holders use it.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Remove even if other live leases (jobs, pins) still hold it.")] = False,
    cache: CacheOpt = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Remove a staged bundle (and its lease) safely.

    Inside a Slurm job only that job's lease is released, and the bundle stays while other
    jobs hold it; outside a job every lease on it is released and it is removed.
    """
    from ocistage.stagers.markers import releasing_holder
    from ocistage.stagers.unstage import unstage

    setup_logging(verbose)
    settings = load_cli_settings(cache=cache)
    removed = unstage(path, cache_root=settings.cache, holder=releasing_holder(pin),
                      force=force)
    if json_output:
        print_json({"path": str(path.absolute()), "removed": removed})
        return
    if not quiet:
        echo(f"{'removed' if removed else 'kept (absent or still in use)'} {path}", err=True)

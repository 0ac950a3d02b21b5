"""`ocistage stage` and `ocistage unstage`: parse options, call stagers, render results."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from ocistage.bundler.cli.common import (
    STAGING,
    CommonOptions,
    complete_cached_ref,
    complete_words,
    console,
    download_progress,
    echo,
    examples,
    is_terminal,
    print_warnings,
    with_options,
)
from ocistage.errors import UsageError

# The stagers, the cache, the bundler and their dependencies are imported inside the commands:
# every `ocistage` invocation imports this module, few of them stage (see
# ocistage.bundler.cli.common).


# the commands' typer apps, built when their command runs (ocistage.bundler.cli.commands)
stage_app = typer.Typer(rich_markup_mode=None, add_completion=False)
unstage_app = typer.Typer(rich_markup_mode=None, add_completion=False)


@stage_app.command("stage", epilog=examples(
    "ocistage stage registry.site:5000/team/app:1.2 --to /scratch/$USER/bundles",
    "ocistage stage ~/app --to \"$SLURM_TMPDIR\"             # node-local, in a job",
    "ocistage stage docker://debian:bookworm --to /scratch/b --format squashfs",
    "srun --container \"$(ocistage stage -q REF --to /scratch/b)\" CMD"))
@with_options(*STAGING)
def stage_command(
    what: Annotated[str, typer.Argument(
        metavar="REF|BUNDLE|DIR|URL", autocompletion=complete_cached_ref,
        help="A bundle directory (has config.json), any directory tree, a squashfs image URL "
             "(file://, memory://, sftp://, s3://...), or an image reference that names its "
             "registry or transport (docker.io/library/alpine, localhost:5000/app, "
             "docker://alpine, oci:DIR), bundled first. Anything that looks like a path is a "
             "path, and a bare name such as `mybundle` that is no directory here is an error "
             "(no registry is guessed).")],
    to: Annotated[str | None, typer.Option(
        "--to", metavar="TARGET",
        help="Directory to stage into (shared or node-local; created with its parents if "
             "missing), or an fsspec URL to store a squashfs image (--format squashfs) or a "
             "tar archive (--format dir) at [default: $OCISTAGE_STAGE_TO, else stage_to in "
             "the config file].")] = None,
    format: Annotated[str, typer.Option(
        "--format", metavar="dir|squashfs", autocompletion=complete_words("dir", "squashfs"),
        help="dir: a directory bundle; squashfs: an image, mounted with squashfuse or "
             "unpacked.")] = "dir",
    name: Annotated[str | None, typer.Option(
        "--name", help="Name of the staged bundle under TARGET [default: for a REF its "
                       "repository and tag, e.g. debian+bookworm, so staging the tag again "
                       "replaces it; else the directory's name].")] = None,
    pin: Annotated[str | None, typer.Option(
        "--pin", metavar="NAME",
        help="Hold the staged bundle with this pin (until `ocistage unstage --pin NAME`) "
             "[default: the Slurm job inside a job, else the pin stage:USER].")] = None,
    all_nodes: Annotated[bool, typer.Option(
        "--all-nodes", help="Inside a Slurm job: stage on every node of the allocation "
                            "(srun, one task per node); each node's copy is removed on that "
                            "node when the job ends (a cleanup job per node), unless --pin "
                            "holds it.")] = False,
    link: Annotated[bool | None, typer.Option(
        "--link/--copy",
        help="--link: insist on hardlinks from the source (a bundle in the cache only); "
             "--copy: independent copies "
             "[default: hardlinks from a cached bundle, else the target's pool].")] = None,
    mount: Annotated[bool | None, typer.Option(
        "--mount/--unpack", help="squashfs: insist on mounting, or always unpack "
                                 "[default: mount where FUSE works, else unpack].")] = None,
    jobs: Annotated[int, typer.Option(
        "--jobs", "-j", min=1, max=64, help="Parallel file operations.")] = 8,
    json_lines: Annotated[bool, typer.Option("--json-lines", hidden=True)] = False,
    node_local: Annotated[bool, typer.Option("--node-local", hidden=True)] = False,
    *,
    opts: CommonOptions,
) -> None:
    """Put a bundle where jobs run (shared or node-local); print its path.

    A REF is bundled first and staged as REPOSITORY+TAG (staging the tag again replaces
    it); a re-stage copies only the files that changed.
    """
    from ocistage.bundler.flows.stage import StageOptions, stage

    settings = opts.settings()
    silent = opts.quiet or opts.json or json_lines
    with _image_progress(silent or format != "squashfs") as image_progress:
        staged = stage(what, StageOptions(to=settings.stage_target(to), format=format,
                                          name=name, pin=pin, all_nodes=all_nodes, link=link,
                                          mount=mount, jobs=jobs, node_local=node_local),
                       store=opts.store(settings),
                       pull_options=lambda: opts.pull_options(settings),
                       progress=lambda: download_progress(silent),
                       image_progress=image_progress)
    print_warnings(staged.warnings, opts.quiet)
    opts.emit(staged, one_line=json_lines)


@contextlib.contextmanager
def _image_progress(silent: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr while a squashfs image is built, on a terminal; elsewhere (a
    batch job's log) a line when it starts and one when it is done, with the time."""
    if silent:
        yield None
        return
    if not is_terminal():
        with _image_log_lines() as update:
            yield update
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("building squashfs image"), BarColumn(), MofNCompleteColumn(),
                  console=console(), transient=True) as bars:
        task = bars.add_task("image", total=None)

        def update(done: int, total: int) -> None:
            bars.update(task, completed=done, total=total)

        yield update


@contextlib.contextmanager
def _image_log_lines(clock: Callable[[], float] = time.monotonic,
                     ) -> Iterator[Callable[[int, int], None]]:
    """Two lines on stderr for a squashfs image built while this runs: when mksquashfs starts
    and when it is done (files, seconds); nothing if no image is built."""
    started: list[float] = []
    done_at: list[float] = []

    def update(done: int, total: int) -> None:
        if not started:
            started.append(clock())
            echo("building the squashfs image (mksquashfs) ...", err=True)
        if total and done >= total and not done_at:
            done_at.append(clock())
            echo(f"built the squashfs image: {total} files in {done_at[0] - started[0]:.1f} s",
                 err=True)

    yield update
    if started and not done_at:  # it ended without a last bar of 100%
        echo(f"built the squashfs image in {clock() - started[0]:.1f} s", err=True)


@unstage_app.command("unstage", epilog=examples(
    "ocistage unstage /scratch/$USER/bundles/team+app+1.2",
    "ocistage unstage --pin nightly /scratch/$USER/bundles/team+app+1.2"))
@with_options("cache", "json", "quiet", "verbose")
def unstage_command(
    path: Annotated[Path, typer.Argument(
        metavar="PATH", help="The path `ocistage stage` printed.")],
    pin: Annotated[str | None, typer.Option(
        "--pin", metavar="NAME", help="Release only this pin's lease; keep the bundle while "
                                      "other holders use it.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Remove even if other live leases (jobs, pins) still hold it.")] = False,
    missing_ok: Annotated[bool, typer.Option(
        "--missing-ok", help="No error if nothing is staged at PATH (as rm -f; a cleanup "
                             "after the bundle was removed).")] = False,
    *,
    opts: CommonOptions,
) -> None:
    """Remove a staged bundle (and its lease) safely.

    Inside a Slurm job only that job's lease is released, and the bundle stays while other
    jobs hold it; outside a job every lease on it is released and it is removed.
    """
    from ocistage.stagers.markers import releasing_holder
    from ocistage.stagers.unstage import Unstaged, holds_lease, unstage

    cache_root, holder = opts.settings().cache, releasing_holder(pin)
    # a path that is gone is no mistake while a lease of ours is on it (a job's cleanup after
    # `unstage --force` or gc removed it): the lease is released
    absent = not os.path.lexists(path)
    leased = not absent or holds_lease(cache_root, path, holder)
    if not leased and not missing_ok:
        raise UsageError(f"nothing is staged at {path}",
                         "give the path `ocistage stage` printed (`ocistage cache ls` lists "
                         "what is staged)")
    removed = unstage(path, cache_root=cache_root, holder=holder, force=force)
    opts.emit(Unstaged(path, removed, absent=absent, leased=leased))

"""`ocistage stage` and `ocistage unstage`: parse options, call stagers, render results."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from bundler.cli_common import (
    CacheOpt,
    CaFileOpt,
    InsecureOpt,
    JsonOpt,
    MirrorOpt,
    PlatformOpt,
    PullOpt,
    QuietOpt,
    VerboseOpt,
    download_progress,
    human_size,
    print_json,
    print_warnings,
    pull_options,
    settings_from,
    setup_logging,
    stderr,
    stdout,
)
from cache.errors import UsageError

if TYPE_CHECKING:
    from bundler.settings import Settings
    from cache.leases import Holder
    from cache.store import Store
    from stagers.stage import StageResult

# The stagers, the cache, the bundler and their dependencies are imported inside the commands:
# every `ocistage` invocation imports this module, few of them stage (see bundler.cli_common).


def register(app: typer.Typer) -> None:
    app.command("stage")(stage_command)
    app.command("unstage")(unstage_command)


def _result_json(result: StageResult, source: str) -> dict[str, Any]:
    return {"path": str(result.path), "source": source, "node": socket.gethostname(),
            "method": result.method, "files": result.files, "copied": result.copied,
            "linked": result.linked, "unchanged": result.unchanged,
            "bytesCopied": result.bytes_copied, "leaseId": result.lease_id}


def _inner_argv(source: str, to: str, cache: Path, options: dict[str, Any]) -> list[str]:
    """The ``ocistage stage`` argv each node runs: the resolved source, one JSON line out."""
    command = shutil.which("ocistage")
    argv = [command] if command else [sys.executable, "-m", "bundler.cli"]
    argv += ["stage", source, "--to", to, "--cache", os.fspath(cache), "--json-lines"]
    for option, value in options.items():
        if value is True:
            argv.append(option)
        elif value is not None and value is not False:
            argv += [option, str(value)]
    return argv


def stage_command(
    what: Annotated[str, typer.Argument(
        metavar="REF|BUNDLE|DIR|URL",
        help="A bundle directory (has config.json), any directory tree, a squashfs image URL "
             "(file://, memory://, sftp://, s3://...), or an image reference (bundled first).")],
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
    if format not in ("dir", "squashfs"):
        raise UsageError(f"unknown format {format!r}", "use --format dir or --format squashfs")
    from cache.store import Store
    from stagers.allnodes import stage_all_nodes
    from stagers.markers import default_holder
    from stagers.remote import is_url, push_tree, stage_from_url
    from stagers.stage import stage_directory

    settings = settings_from(cache, insecure_registry, mirror, ca_file, None, pull_policy)
    to = to or settings.stage_to
    if not to:
        raise UsageError("no stage target",
                         "pass --to DIR|URL, set $OCISTAGE_STAGE_TO, or put stage_to = \"DIR\" "
                         "in the config file")
    cache_root = settings.cache
    store = Store.open(cache_root)
    source, label = _resolve(what, settings, store, platform,
                             quiet or json_output or json_lines)
    if all_nodes:
        options: dict[str, Any] = {
            "--format": format, "--name": name, "--pin": pin, "--jobs": jobs,
            "--link": link is True, "--copy": link is False,
            "--mount": mount is True, "--unpack": mount is False}
        results = stage_all_nodes(_inner_argv(os.fspath(source) if source else what, to,
                                              cache_root.absolute(), options))
        if json_output:
            print_json([r.result for r in results])
            return
        for r in results:
            stdout.print(f"{escape(r.node)}: {escape(str(r.result.get('path')))}")
        return
    holder = default_holder(pin)
    if is_url(to):
        if source is None:
            raise UsageError(f"cannot stage {what} to another URL",
                             "stage from a bundle, a directory or a REF to a URL")
        work = store.temp_dir("push")  # owned by this process: removed if we die
        try:
            pushed = push_tree(source, to, name or source.name, format=format, work=work,
                               label=label, jobs=jobs)
        finally:
            store.remove_temp_dir(work)
        if json_output or json_lines:
            line = {"url": pushed.url, "format": pushed.format, "size": pushed.size}
            _emit(line, json_lines)
            return
        stdout.print(pushed.url)
        return
    if source is None:
        result = stage_from_url(what, Path(to), cache_root=cache_root, name=name,
                                holder=holder, mount_image=mount)
    else:
        result = stage_directory(source, Path(to), cache_root=cache_root, name=name,
                                 holder=holder, link=link, jobs=jobs,
                                 format="squashfs" if format == "squashfs" else "dir",
                                 source_label=label, squashfs_mount=mount)
    if json_output or json_lines:
        _emit(_result_json(result, label), json_lines)
        return
    if not quiet:
        stderr.print(f"staged {escape(label)} ({result.method}: {result.files} files, "
                     f"{result.copied} copied ({human_size(result.bytes_copied)}), "
                     f"{result.linked} linked, {result.unchanged} unchanged)")
    stdout.print(str(result.path))


def _emit(doc: dict[str, Any], one_line: bool) -> None:
    if one_line:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        print_json(doc)


def _resolve(what: str, settings: Settings, store: Store, platform: str | None,
             quiet: bool) -> tuple[Path | None, str]:
    """The directory to stage and its label; (None, url) for a URL source."""
    from stagers.remote import is_url

    if is_url(what):
        return None, what
    path = Path(what)
    if path.is_dir():
        return path.absolute(), os.fspath(path.absolute())
    from bundler.bundle import make_bundle
    from bundler.reference import parse_reference

    source = parse_reference(what)
    with download_progress(quiet) as progress:
        bundle = make_bundle(source, store, None,
                             pull_options=pull_options(settings, platform), progress=progress)
    print_warnings(bundle.warnings)
    return bundle.path, what


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
    from cache.leases import Holder
    from stagers.unstage import unstage

    setup_logging(verbose)
    settings = settings_from(cache, None, None, None, None)
    holder: Holder | None = None
    if pin:
        holder = Holder.pin(pin)
    elif os.environ.get("SLURM_JOB_ID"):
        holder = Holder.slurm_job(os.environ["SLURM_JOB_ID"])
    removed = unstage(path, cache_root=settings.cache, holder=holder, force=force)
    if json_output:
        print_json({"path": str(path.absolute()), "removed": removed})
        return
    if not quiet:
        stderr.print(f"{'removed' if removed else 'kept (absent or still in use)'} "
                     f"{escape(str(path))}")

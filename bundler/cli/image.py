"""`ocistage pull`, `ocistage inspect` and `ocistage bundle`: the image commands."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from ocistage.bundler.cli.common import (
    PULLING,
    CommonOptions,
    RefArg,
    echo,
    examples,
    print_warnings,
    with_options,
)

# The library is imported inside the commands (see ocistage.bundler.cli.common).

# the commands' typer apps, built when their command runs (ocistage.bundler.cli.commands)
pull_app = typer.Typer(rich_markup_mode=None, add_completion=False)
inspect_app = typer.Typer(rich_markup_mode=None, add_completion=False)
bundle_app = typer.Typer(rich_markup_mode=None, add_completion=False)

# -- pull ------------------------------------------------------------------------------------


@pull_app.command("pull", epilog=examples(
    "ocistage pull registry.site:5000/team/app:1.2",
    "ocistage pull --platform linux/arm64 docker.io/library/alpine:3.20",
    "ocistage pull oci-archive:./app.tar:1.2"))
@with_options(*PULLING)
def pull_command(ref: RefArg, opts: CommonOptions) -> None:
    """Fetch an image into the cache; print its manifest digest.

    The manifest, config and layers are verified against their digests; layers already
    cached are not fetched again.
    """
    from ocistage.bundler.pull import pull

    settings = opts.settings()
    with opts.progress() as progress:
        image = pull(*opts.image_inputs(ref, settings), progress)
    print_warnings(image.warnings, opts.quiet)
    opts.emit(image)


# -- inspect ---------------------------------------------------------------------------------


@inspect_app.command("inspect", epilog=examples(
    "ocistage inspect docker.io/library/debian:bookworm",
    "ocistage inspect --json registry.site:5000/team/app:1.2 | jq .platforms"))
@with_options("cache", "platform", "insecure_registry", "mirror", "ca_file", "json", "verbose")
def inspect_command(ref: RefArg, opts: CommonOptions) -> None:
    """Show an image's manifest, config, platforms and layer sizes.

    Layers are not fetched: only the manifest (or index) and the config are.
    """
    from ocistage.bundler.inspect import inspect_image

    opts.emit(inspect_image(*opts.image_inputs(ref, opts.settings())), rich=True)


# -- bundle ------------------------------------------------------------------------------------


@bundle_app.command("bundle", epilog=examples(
    "ocistage bundle registry.site:5000/team/app:1.2            # in the cache",
    "ocistage bundle registry.site:5000/team/app:1.2 ~/app      # a directory of yours",
    "ocistage bundle --cmd python3 --cmd train.py --mount /data:/data REF DEST",
    "ocistage bundle --json REF | jq -r .path"))
@with_options(*PULLING)
def bundle_command(
    ref: RefArg,
    dest: Annotated[Path | None, typer.Argument(
        metavar="[DEST]", help="Bundle directory to create, with its parents if missing; it "
                               "must be absent or empty [default: in the cache, keyed by "
                               "image digest and options].")] = None,
    cmd: Annotated[list[str] | None, typer.Option(
        "--cmd", "--arg", metavar="ARG",
        help="Replace the image's Cmd (repeat for each argument; Entrypoint is kept).")] = None,
    entrypoint: Annotated[list[str] | None, typer.Option(
        "--entrypoint", metavar="ARG",
        help="Replace the image's Entrypoint (repeatable; clears the image's Cmd).")] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", metavar="NAME=VALUE", help="Set an environment variable (repeatable).")
    ] = None,
    mount: Annotated[list[str] | None, typer.Option(
        "--mount", metavar="SRC:DST[:ro]", help="Bind-mount a host path (repeatable).")] = None,
    readonly: Annotated[bool, typer.Option(
        "--readonly", help="Make the container's root filesystem read-only.")] = False,
    hostname: Annotated[str | None, typer.Option(
        "--hostname", help="Give the container its own UTS namespace with this hostname.")
    ] = None,
    rootless: Annotated[bool, typer.Option(
        "--rootless/--no-rootless",
        help="Rootless config: user namespace mapping you to the image user, no cgroups. "
             "--no-rootless: for a privileged runtime (made by root: the rootfs has the "
             "image's file owners).")
    ] = True,
    map_root: Annotated[bool, typer.Option(
        "--map-root", help="Rootless: run as root inside the container instead of the image "
                           "user.")] = False,
    map_self: Annotated[bool, typer.Option(
        "--map-self", help="Rootless: run as your own uid/gid inside the container (MPI ranks "
                           "under srun --mpi=pmix need it; crun or runc >= 1.2).")] = False,
    link: Annotated[bool, typer.Option(
        "--link", help="Make DEST from the cache's snapshot by hard links: fast, shares files "
                       "with the cache, so the root filesystem is read-only (a copy where "
                       "DEST refuses links from the cache, e.g. another mount).")] = False,
    keep_snapshot: Annotated[bool | None, typer.Option(
        "--keep-snapshot/--no-keep-snapshot",
        help="Unpack the image into a snapshot kept in the cache and copy DEST from it, so a "
             "later --link or cached bundle of it unpacks nothing; writes the tree twice "
             "[default: keep_snapshot in the config file, else only where copies from the "
             "cache are reflinks, e.g. btrfs, XFS].")] = None,
    gpus: Annotated[str | None, typer.Option(
        "--gpus", metavar="all|IDS",
        help="Expose NVIDIA GPUs: all, or GPU indices, MIG devices or UUIDs such as 0,1 "
             "(the nvidia-container-runtime-hook prestart hook + CDI annotation).")] = None,
    *,
    opts: CommonOptions,
) -> None:
    """Make a rootless OCI bundle from an image; print its path.

    The bundle is rootfs/ and config.json, for runc and crun; without DEST it is made in
    the cache and reused while the image and options are the same.
    """
    from ocistage.bundler.configoptions import ConfigOptions
    from ocistage.bundler.flows.bundle import make_bundle, run_notices

    settings = opts.settings(keep_snapshot=keep_snapshot)
    source, store, options = opts.image_inputs(ref, settings)
    config_options = ConfigOptions(
        rootless=rootless, args=cmd or None, entrypoint=entrypoint or None, env=env or (),
        mounts=mount or (), readonly=readonly, hostname=hostname, gpus=gpus,
        map_root=map_root, map_self=map_self)
    with opts.progress() as progress:
        result = make_bundle(source, store, dest, pull_options=options,
                             config_options=config_options, progress=progress, link=link,
                             keep_snapshot=settings.keep_snapshot)
    result = dataclasses.replace(result, warnings=result.warnings + run_notices(result.path))
    print_warnings(result.warnings, opts.quiet)
    if gpus:  # the config writer's module only then: a warm bundle does without it
        from ocistage.bundler.runtime_config import gpu_hook_missing

        hook = gpu_hook_missing(gpus)
        if hook:
            echo(f"warning: {hook}", err=True)
    opts.emit(result)

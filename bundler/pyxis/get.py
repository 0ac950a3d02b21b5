"""``importer get URI``: the image's squashfs, made once per store, leased to the job step.

The settings are read once, here at the entry (:func:`get`), into one owner per concern: the
store the user only reads (``SiteStore``) and the one images are made in (``ImageStore``), the
cache with its pull options (``CacheSource``), the pull policy; the job step (``JobStep``)
comes from the caller. Nothing past the entry sees the settings. Then:

0. with the pull policy ``missing`` (the importer's default) or ``never``, use what the
   reference resolved to before if that image is in a store (a note in ``STORE/pyxis/refs/``;
   no network, no registry client: the warm get, :func:`recalled`);
1. pull it through the cache as ``ocistage pull`` does (mirrors, the pull policy, site and
   user config; credentials from the docker/podman auth files and from enroot's own
   ``.credentials`` netrc);
2. once the pull has resolved the manifest (the image's key): use the site store's image of
   the key if the site made it; else take the step's lease on the image of the user's store
   (``squashfs:<key>``: ``cache gc`` keeps what a live job holds) and build it if it is
   missing, once for all the ranks and nodes asking at once, unpacking the layers while they
   download (:func:`~ocistage.bundler.pyxis.build.obtain`).
3. with ``pyxis_squashfs_only``, drop from the cache what this get's pull recorded there and
   the blobs only that used (:meth:`~ocistage.bundler.pyxis.cachesource.CacheSource.drop_pulled`).

Nothing half-built is ever at a key's path; a failed build leaves only its scratch directory,
which the next command (or ``cache gc``) removes, and its partial downloads, which the next
``get`` resumes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ocistage.bundler.image.reference import RegistryReference
from ocistage.bundler.pyxis.build import obtain
from ocistage.bundler.pyxis.cachesource import CacheSource
from ocistage.bundler.pyxis.credentials import EnrootCredentials
from ocistage.bundler.pyxis.imagestore import ImageStore
from ocistage.bundler.pyxis.jobstep import JobStep
from ocistage.bundler.pyxis.mksquashfs import Mksquashfs, compression_setting
from ocistage.bundler.pyxis.sitestore import SiteStore
from ocistage.bundler.pyxis.uri import EnrootUri, parse_enroot_uri
from ocistage.bundler.settings import DEFAULT, Settings
from ocistage.cache.store import Store

if TYPE_CHECKING:
    from ocistage.bundler.pull import PullOptions
    from ocistage.bundler.registry.credentials import CredentialStore


@dataclass(frozen=True)
class GetResult:
    path: Path
    built: bool              # this call made the image
    manifest: str
    key: str


def effective_policy(settings: Settings) -> str:
    """The pull policy of a get: the configured one (``--pull`` has no option here: the
    environment or a config file), else ``missing``: a reference imported before is used as
    it was, without asking the registry (docs/pyxis.md)."""
    return settings.pull if settings.origins.get("pull", DEFAULT) != DEFAULT else "missing"


def pull_options(settings: Settings, credentials: CredentialStore, policy: str) -> PullOptions:
    from ocistage.bundler.pull import PullOptions

    registry = dataclasses.replace(settings.registry_config(), credentials=credentials)
    return PullOptions(jobs=settings.jobs, registry=registry, max_size=settings.max_size,
                       policy=policy, unpack_limit=settings.unpack_limit,
                       trust=settings.trust_config())


def get(uri: str, settings: Settings, step: JobStep,
        environ: Mapping[str, str] | None = None) -> GetResult:
    """``importer get URI``: the image's squashfs, made once, leased to ``step``.

    Images go to the site's ``pyxis_store`` if set and this user may write there, else to the
    user's cache; a site store this user cannot write is only read (a store that does not
    exist is the site's to make, with the mode it wants: docs/pyxis.md). A get that fails or
    is interrupted drops the leases it made (:meth:`JobStep.drop_taken`)."""
    try:
        return _get(uri, settings, step, environ)
    except BaseException:  # failed or interrupted: the leases it made protect nothing in use
        step.drop_taken()
        raise


def _get(uri: str, settings: Settings, step: JobStep,
         environ: Mapping[str, str] | None) -> GetResult:
    """:func:`get`, whose caller drops the step's leases this get made if it fails."""
    from ocistage.bundler.trust.files import policy_applies

    parsed = parse_enroot_uri(uri)
    shared = settings.pyxis_store
    writable = shared is not None and os.access(shared, os.W_OK)
    site = SiteStore(shared) if shared is not None and not writable else None
    images = ImageStore(shared if shared is not None and writable else settings.cache)
    policy = effective_policy(settings)
    # an image policy decides in the pull, also for an image made before: no recall then
    if policy == "always" or policy_applies(settings.trust_config()):
        return fetched(parsed.reference, cache_source(settings, parsed, policy, environ),
                       site, images, step)
    found = recalled(parsed.reference, site, images, step)
    if found is not None:
        return found
    # the first of the nodes asking at once asks the registry and makes the image; the
    # others wait until it is done and recall its note, asking the registry nothing (and if
    # it failed, the next takes its place)
    while True:
        with images.resolving(parsed.reference) as first:
            found = recalled(parsed.reference, site, images, step)
            if found is not None:
                return found
            if first:
                return fetched(parsed.reference,
                               cache_source(settings, parsed, policy, environ), site, images,
                               step)


def cache_source(settings: Settings, parsed: EnrootUri, policy: str,
                 environ: Mapping[str, str] | None) -> CacheSource:
    """The cache the image is pulled into, opened, with the pull's options: the settings',
    the pull policy and enroot's credentials for the URI's user."""
    options = pull_options(settings, EnrootCredentials(parsed.user, environ), policy)
    return CacheSource(Store.open(settings.cache), options, settings.pyxis_squashfs_only,
                       compression_setting(settings.pyxis_compression))


def recalled(reference: RegistryReference, site: SiteStore | None, images: ImageStore,
             step: JobStep) -> GetResult | None:
    """The image a reference resolved to before, leased to ``step``; None if there is none.
    No network and no registry client: the warm get."""
    made = site.recalled(reference) if site is not None else None
    if made is not None:
        path, noted = made
        return GetResult(path, False, noted.manifest, noted.key)
    found = images.recalled(reference, step)
    if found is None:
        return None
    return GetResult(images.path(found.key), False, found.manifest, found.key)


def fetched(reference: RegistryReference, source: CacheSource, site: SiteStore | None,
            images: ImageStore, step: JobStep) -> GetResult:
    """The image of ``reference`` as the registry has it now (pulled into ``source``): the
    site store's, else the one in ``images``, made there if it is missing."""
    mksquashfs = Mksquashfs.on_this_node(source.compression)
    with source.leased() as cache:
        recorded = cache.recorded(reference)  # before the pull: then not this get's to drop
        made = obtain(reference, cache, site, images, step, mksquashfs)
    if not made.site:
        images.remember(reference, made.key, made.manifest)
        images.touch(made.key)
    if not recorded:
        source.drop_pulled(reference)  # with pyxis_squashfs_only: the image needs no layers
    return GetResult(made.path, made.built, made.manifest, made.key)

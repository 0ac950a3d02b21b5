"""``importer get URI``: the image's squashfs, made once per store, leased to the job step.

The settings are read once, here at the entry (:class:`Places`, :func:`effective_policy`,
:func:`pull_options`); every step after takes only what it needs:

0. with the pull policy ``missing`` (the importer's default) or ``never``, use what the
   reference resolved to before if that image is in a store (a note in ``STORE/pyxis/refs/``;
   no network, no registry client: the warm get, :func:`recalled`);
1. pull it through the cache as ``ocistage pull`` does (mirrors, the pull policy, site and
   user config; credentials from the docker/podman auth files and from enroot's own
   ``.credentials`` netrc);
2. use the site store's image of the key if the site made it; else take the step's lease on
   the image of the user's store (``squashfs:<key>``: ``cache gc`` keeps what a live job holds)
   and build it if it is missing, once for all the ranks and nodes asking at once
   (:func:`~ocistage.bundler.pyxis.build.build`).

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

from ocistage.bundler.errors import PyxisImportError
from ocistage.bundler.image.reference import RegistryReference
from ocistage.bundler.pyxis.build import build
from ocistage.bundler.pyxis.credentials import EnrootCredentials
from ocistage.bundler.pyxis.imagestore import ImageStore, image_key, present
from ocistage.bundler.pyxis.jobstep import JobStep
from ocistage.bundler.pyxis.mksquashfs import Mksquashfs
from ocistage.bundler.pyxis.refnotes import recall, remember
from ocistage.bundler.pyxis.sitestore import readable_store, site_image
from ocistage.bundler.pyxis.uri import parse_enroot_uri
from ocistage.bundler.settings import DEFAULT, Settings
from ocistage.cache.leases import InUse
from ocistage.cache.pyxisimages import REFS_DIR, image_path_at
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


@dataclass(frozen=True)
class Places:
    """Where a get pulls, and looks for and makes images."""

    cache: Path              # the cache images are pulled into
    own: Path                # the store images are made in: the site's if writable, else cache
    site: Path | None        # a site store this user only reads (filled by the site)

    @classmethod
    def of(cls, settings: Settings) -> Places:
        """The site's ``pyxis_store`` if set and this user may write there, else the user's
        cache (a store that does not exist is the site's to make, with the mode it wants:
        docs/pyxis.md); a site store this user cannot write is only read."""
        shared = settings.pyxis_store
        if shared is not None and os.access(shared, os.W_OK):
            return cls(settings.cache, shared, None)
        return cls(settings.cache, settings.cache, shared)


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
    """``importer get URI``: the image's squashfs, made once, leased to ``step``."""
    from ocistage.bundler.trust.files import policy_applies

    parsed = parse_enroot_uri(uri)
    places = Places.of(settings)
    policy = effective_policy(settings)
    # an image policy decides in the pull, also for an image made before: no recall then
    if policy != "always" and not policy_applies(settings.trust_config()):
        found = recalled(parsed.reference, places, step)
        if found is not None:
            return found
    options = pull_options(settings, EnrootCredentials(parsed.user, environ), policy)
    return fetched(parsed.reference, places, options, step)


def recalled(reference: RegistryReference, places: Places, step: JobStep) -> GetResult | None:
    """The image a reference resolved to before, leased to ``step``; None if there is none.
    No network and no registry client: the warm get."""
    site = places.site
    if site is not None and readable_store(site, REFS_DIR):
        found = recall(site, reference)
        if found is not None and site_image(site, found[0]) is not None:
            return GetResult(image_path_at(site, found[0]), False, found[1], found[0])
    images = ImageStore.open(places.own)
    images.directory(REFS_DIR)  # notes and images: only from trusted directories
    found = recall(images.root, reference)
    if found is None:
        return None
    step.hold(images.root, found[0])
    final = images.path(found[0])
    if not present(final):
        return None
    images.touch(found[0])
    return GetResult(final, False, found[1], found[0])


def fetched(reference: RegistryReference, places: Places, options: PullOptions,
            step: JobStep) -> GetResult:
    """The image of ``reference`` as the registry has it now (pulled through the cache),
    from the site store, else made in the user's store if it is not there."""
    cache = Store.open(places.cache)
    # one lease from the pull to mksquashfs's last read: another member's gc of a group-shared
    # cache evicted the image's blobs between the two (the endurance test)
    with InUse(cache.root) as in_use:
        manifest = pull_manifest(reference, cache, options, in_use)
        mksquashfs = Mksquashfs.on_this_node()
        key = image_key(manifest, mksquashfs.compressor)
        shared = site_image(places.site, key) if places.site is not None else None
        if shared is not None:
            return GetResult(shared, False, manifest, key)
        images = ImageStore.open(places.own)
        final, built = images.provide(key, step, lambda: build(
            reference, cache, images, key, options, mksquashfs, manifest, in_use))
    remember(images, reference, key, manifest)
    images.touch(key)
    return GetResult(final, built, manifest, key)


def pull_manifest(reference: RegistryReference, cache: Store, options: PullOptions,
                  in_use: InUse | None = None) -> str:
    """Pull ``reference`` into ``cache`` as ``ocistage pull`` does (no cache budget: a GC
    during a job's start would only slow it), under the caller's lease ``in_use`` if given;
    the manifest digest. A refusal of the policy ``never`` says how to change it where pyxis
    users can (no ``--pull`` here)."""
    from ocistage.bundler.errors import SourceError
    from ocistage.bundler.pull import pull

    try:
        pulled = pull(reference, cache, dataclasses.replace(options, max_size=None),
                      in_use=in_use)
    except SourceError as exc:
        if options.policy != "never":
            raise
        raise PyxisImportError(
            f"{exc.message}, and the pull policy is never",
            "pull it first (`ocistage pull` with the job's cache), or unset OCISTAGE_PULL "
            "(or `pull` in the config file): the importer's default is missing") from exc
    return str(pulled.manifest.digest)

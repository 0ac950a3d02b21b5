"""``ocistage inspect``: what an image is made of, without fetching its layers.

Resolves the reference (manifest or index), lists the platforms of an index, chooses one, and
fetches that platform's manifest and config. Manifests and the config are small, verified and
kept in the store (a later pull reuses them); layers are only described.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ocistage.bundler.image.manifest import Descriptor, ImageConfig, ImageIndex, parse_image_config
from ocistage.bundler.image.platform import Platform, host_platform
from ocistage.bundler.image.reference import ImageSource
from ocistage.bundler.pull import Fetcher, PullOptions, resolve
from ocistage.bundler.sources import open_provider
from ocistage.cache.digest import Digest
from ocistage.cache.sizes import count, format_size
from ocistage.cache.store import Store

if TYPE_CHECKING:
    from ocistage.results import Renderer


@dataclass(frozen=True)
class ImageReport:
    source: str
    digest: Digest                       # what the reference resolves to (index or manifest)
    media_type: str
    platforms: tuple[tuple[Platform | None, Descriptor], ...]   # of an index; () otherwise
    platform: Platform
    manifest: Descriptor
    layers: tuple[Descriptor, ...]
    config_digest: Digest
    config: ImageConfig

    @property
    def compressed_size(self) -> int:
        return sum(layer.size for layer in self.layers)

    def to_json(self) -> dict[str, Any]:
        settings = self.config.container
        return {
            "source": self.source,
            "digest": str(self.digest),
            "media_type": self.media_type,
            "platforms": [
                {"platform": str(p) if p else None, "digest": str(d.digest),
                 "media_type": d.media_type, "size": d.size}
                for p, d in self.platforms
            ],
            "platform": str(self.platform),
            "manifest": {"digest": str(self.manifest.digest),
                         "media_type": self.manifest.media_type, "size": self.manifest.size},
            "config": {
                "digest": str(self.config_digest),
                "created": self.config.created,
                "os": self.config.os,
                "architecture": self.config.architecture,
                "variant": self.config.variant,
                "config": {
                    "entrypoint": settings.entrypoint, "cmd": settings.cmd,
                    "env": list(settings.env), "working_dir": settings.working_dir,
                    "user": settings.user, "labels": dict(settings.labels),
                    "volumes": list(settings.volumes),
                    "exposed_ports": list(settings.exposed_ports),
                    "stop_signal": settings.stop_signal,
                },
            },
            "layers": [
                {"digest": str(layer.digest), "media_type": layer.media_type,
                 "size": layer.size}
                for layer in self.layers
            ],
            "size": self.compressed_size,
        }

    def render(self, out: Renderer) -> None:
        settings = self.config.container
        out.heading(self.source)
        out.line(f"  digest:     {self.digest}  ({self.media_type})")
        if self.platforms:
            out.line("  platforms:  " + ", ".join(str(p) if p else "unknown"
                                                  for p, _ in self.platforms))
        out.line(f"  platform:   {self.platform}  manifest {self.manifest.digest}")
        out.line(f"  created:    {self.config.created or '-'}")
        for key, value in (("entrypoint", settings.entrypoint), ("cmd", settings.cmd),
                           ("workdir", settings.working_dir), ("user", settings.user)):
            if value:
                out.line(f"  {key + ':':<12}{json.dumps(value)}")
        for variable in settings.env:
            out.line(f"  env:        {variable}")
        for label, value in settings.labels.items():
            out.line(f"  label:      {label}={value}")
        for n, layer in enumerate(self.layers, start=1):
            out.line(f"  layer {n}:{'':<3}{layer.digest}  {format_size(layer.size):>10}  "
                     f"{layer.media_type}")
        out.line(f"  total:      {format_size(self.compressed_size)} "
                 f"in {count(len(self.layers), 'layer')}")


def inspect_image(source: ImageSource, store: Store,
                  options: PullOptions | None = None) -> ImageReport:
    options = options or PullOptions()
    wanted = (options.platform or host_platform()).normalized()
    provider = open_provider(source, options.registry)
    try:
        resolved = resolve(provider, wanted)
        top = resolved.index_fetched or resolved.manifest_fetched
        platforms: tuple[tuple[Platform | None, Descriptor], ...] = ()
        if isinstance(resolved.index, ImageIndex):
            platforms = tuple((d.platform, d) for d in resolved.index.manifests)
        manifest = resolved.manifest
        Fetcher(provider, store).fetch(manifest.config, "config")
        config = parse_image_config(store.read_blob(manifest.config.digest))
        store.put_blob(resolved.manifest_fetched.data, resolved.manifest_fetched.digest)
        return ImageReport(
            source=str(source),
            digest=top.digest,
            media_type=top.media_type,
            platforms=platforms,
            platform=resolved.platform,
            manifest=Descriptor(media_type=manifest.media_type,
                                digest=resolved.manifest_fetched.digest,
                                size=len(resolved.manifest_fetched.data)),
            layers=manifest.layers,
            config_digest=manifest.config.digest,
            config=config,
        )
    finally:
        provider.close()

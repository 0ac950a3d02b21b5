"""ocistage: registry images -> rootless OCI bundles -> staged where Slurm jobs run.

One import name for the whole product (docs/architecture.md): ``ocistage.bundler`` (the CLI,
the registry client, the layer unpacker, bundles), ``ocistage.cache`` (the content-addressed
store), ``ocistage.stagers`` (putting bundles where jobs run) and ``ocistage.runtimes`` (the
hand-off to Slurm and OCI runtimes). The repository keeps these as top-level folders; the build
maps them here (``package-dir`` in pyproject.toml), and in a checkout the links in this folder
do the same, so tools and ``python -m ocistage`` work without an install.
"""

__version__ = "0.1.0"

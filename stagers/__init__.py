"""Putting bundles where jobs run (shared FS, node-local FS, fsspec URLs, all nodes)."""

"""Content-addressed store shared by every ocistage command (blobs, snapshots, bundles)."""

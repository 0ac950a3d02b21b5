"""The image model: references, manifests, platforms, media types, schema checks."""

"""The front of ocistage: references, registry client, pull, layer unpack, bundle config."""

__version__ = "0.1.0"

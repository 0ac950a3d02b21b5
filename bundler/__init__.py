"""The front of ocistage: references, registry client, pull, layer unpack, bundle config."""

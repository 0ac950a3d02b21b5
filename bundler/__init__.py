"""The front of ocistage: the CLI, the registry client, the layer unpacker, pull and bundle."""

"""The layer unpacker: decompression, the tar reader, the layer applier, path safety."""

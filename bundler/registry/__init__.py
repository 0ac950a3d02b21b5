"""The registry client: transport, auth, credentials, manifests and blobs over HTTP."""

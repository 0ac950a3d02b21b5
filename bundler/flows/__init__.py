"""The library calls behind the commands that make and hand over bundles: bundle, stage, submit."""

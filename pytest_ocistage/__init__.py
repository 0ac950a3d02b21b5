"""pytest fixtures for testing container workflows with ocistage (docs/testing.md).

The plugin (:mod:`pytest_ocistage.plugin`) is loaded by pytest wherever ocistage is installed.
This package also exports what tests build images and check results with.
"""

from pytest_ocistage.bundles import BundleRun
from pytest_ocistage.components import Registry, require_binary
from pytest_ocistage.faultproxy import Fault, FaultProxy
from pytest_ocistage.imagebuild import (
    OPAQUE,
    WHITEOUT,
    BuiltImage,
    Dir,
    File,
    Hardlink,
    Symlink,
    build_image,
    busybox_layer,
)
from pytest_ocistage.runner import OcistageResult, OcistageRunner

__all__ = ["OPAQUE", "WHITEOUT", "BuiltImage", "BundleRun", "Dir", "Fault", "FaultProxy", "File",
           "Hardlink", "OcistageResult", "OcistageRunner", "Registry", "Symlink", "build_image",
           "busybox_layer", "require_binary"]

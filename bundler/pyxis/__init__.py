"""ocistage as pyxis's image importer (``importer=`` in plugstack.conf; docs/pyxis.md).

pyxis runs ``IMPORTER get docker://IMAGE`` as the job user and reads the first line of its
stdout as the absolute path of a squashfs image, which enroot then starts (or unpacks with
``enroot create``); ``IMPORTER release`` (idempotent, called once or twice per step, also after
a failed ``get``) says the step is done with it. ``main`` is that program; ``get`` the flow
behind ``get``. What ``cache ls|du|gc`` know of the images lives below, in
``ocistage.cache.pyxisimages``.
"""

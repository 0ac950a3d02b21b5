"""``ocistage doctor``: what this host can do, what is missing, and what to do about it.

Every check is a small function that takes what it judges (a file's text, a command's output,
a ``stat`` result, a setting) and returns one :class:`~.report.Check`: ``ok``, ``warn`` (works,
with a limit worth knowing) or ``missing`` (something a command needs is absent or refused),
with the fix. The probes that gather those inputs (:mod:`.probes`) are kept apart, so each
check is tested with fake inputs. :func:`.diagnose.diagnose` runs them all, one group per
subject module::

    report.py      Check, DoctorReport, the exit error
    probes.py      what the checks judge, read from the host
    settings.py    config files, CA file, image policy  (core)
    places.py      the cache, the stage target          (core)
    registry.py    a registry asked about               (core)
    runtimes.py    runc, crun
    namespaces.py  user namespaces, subordinate ids, XDG_RUNTIME_DIR
    squashfs.py    FUSE, squashfuse, mksquashfs
    slurm.py       Slurm and its oci.conf
    diagnose.py    the groups, in order

A new check is a function in its subject's module (or a new module) and one line in that
module's group function, or a new group in :func:`.diagnose.diagnose`.

A check is ``core`` when ``pull``, ``bundle``, ``stage`` or the ``cache`` commands depend on
it (the cache, the configured stage target, the config files and CA file, a registry asked
about); ``ocistage doctor`` exits 1 when one of them is missing. The others (runtimes, user
namespaces, FUSE, squashfs tools, Slurm) say what running bundles, squashfs stages and Slurm
jobs need here. Nothing is changed: no directory is made, no file written.
"""

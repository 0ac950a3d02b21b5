"""The PMIx credential check of a bundle's config.json (runtimes/pmix_ids.py, issue 34 item 3)."""

from __future__ import annotations

from typing import Any

from ocistage.runtimes.pmix_ids import pmix_credential_problem


def _config(uid: int, gid: int, host_uid: int, host_gid: int, inside_uid: int,
            inside_gid: int) -> dict[str, Any]:
    return {"process": {"user": {"uid": uid, "gid": gid}},
            "linux": {"namespaces": [{"type": "mount"}, {"type": "user"}],
                      "uidMappings": [{"containerID": inside_uid, "hostID": host_uid,
                                       "size": 1}],
                      "gidMappings": [{"containerID": inside_gid, "hostID": host_gid,
                                       "size": 1}]}}


def test_map_root_bundle_is_refused_by_pmix() -> None:
    problem = pmix_credential_problem(_config(0, 0, 1002, 1002, 0, 0))
    assert problem is not None and "uid 0" in problem and "1002" in problem


def test_image_user_mapped_to_the_caller_is_refused_too() -> None:
    assert pmix_credential_problem(_config(1000, 1000, 1002, 1002, 1000, 1000)) is not None


def test_identity_mapping_and_no_user_namespace_pass() -> None:
    assert pmix_credential_problem(_config(1002, 1002, 1002, 1002, 1002, 1002)) is None
    config = _config(0, 0, 1002, 1002, 0, 0)
    config["linux"]["namespaces"] = [{"type": "mount"}]
    assert pmix_credential_problem(config) is None  # root's bundle: 0 is 0
    assert pmix_credential_problem({"process": "x"}) is None


def test_submit_with_mpi_pmix_warns_before_the_job() -> None:
    from ocistage.runtimes.pmix_ids import asks_for_pmix, mpi_notices

    assert asks_for_pmix(["-N3", "--mpi=pmix_v4"]) and asks_for_pmix(["--mpi", "pmix"])
    assert not asks_for_pmix(["--mpi=none", "-N3"])
    mapped_root = _config(0, 0, 1002, 1002, 0, 0)
    [notice] = mpi_notices(mapped_root, ["--mpi=pmix"])
    assert "--map-self" in str(notice)
    assert mpi_notices(mapped_root, ["-N3"]) == ()
    assert mpi_notices(_config(1002, 1002, 1002, 1002, 1002, 1002), ["--mpi=pmix"]) == ()

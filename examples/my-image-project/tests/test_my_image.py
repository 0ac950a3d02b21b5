"""My image, pulled from a registry as production pulls it, runs my job (docs/testing.md)."""

from pytest_ocistage import File, busybox_layer


def test_my_image_runs_my_job(oci_registry, oci_image, ocistage, run_bundle, tmp_path):
    job = File("#!/bin/sh\necho \"hello from $(id -un), $GREETING\"\n", mode=0o755)
    image = oci_image([busybox_layer(), {"app/job.sh": job}], entrypoint=["/app/job.sh"],
                      env={"GREETING": "good morning"}, user="app", workdir="/app")
    pushed = image.push(oci_registry, "team/my-image")

    assert ocistage("pull", pushed.ref).exit_code == 0
    assert ocistage("inspect", "--json", pushed.ref).json["digest"] == image.digest
    bundle = ocistage("bundle", pushed.ref, str(tmp_path / "bundle"), check=True).stdout.strip()

    run = run_bundle(bundle)
    assert (run.exit_code, run.stdout) == (0, "hello from app, good morning\n")

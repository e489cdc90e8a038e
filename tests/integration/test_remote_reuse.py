"""A cached artifact handed to a remote engine is where the reference says (issue 10, item 4):
the optimizer's S3 location for a blob, built from the services' artifact settings, names the
object the submitter stored, on the real S3 server the suite runs."""

from __future__ import annotations

import uuid
from pathlib import Path

from minio import Minio

from couler import ir
from couler.optimize.reuse import substitute_cached
from couler_optimizer.main import OptimizerSettings, remote_artifact_store
from couler_runtime.blobs import S3BlobStore, digest_of
from tests.servers import SeaweedS3


def test_the_reference_names_the_stored_blob(s3_server: SeaweedS3, tmp_path: Path) -> None:
    bucket = f"couler-{uuid.uuid4().hex[:12]}"
    store = S3BlobStore(s3_server.endpoint, s3_server.access_key, s3_server.secret_key, bucket,
                        prefix="team/artifacts")
    store.ensure_bucket()
    data = tmp_path / "model.bin"
    data.write_bytes(b"weights " * 1000)
    digest = "sha256:" + digest_of(store.put_file(data))
    settings = OptimizerSettings.load(
        "optimizer", artifacts=f"s3://{bucket}/team/artifacts",
        s3_endpoint=f"http://{s3_server.endpoint}", s3_access_key=s3_server.access_key,
        s3_secret_key=s3_server.secret_key, state_dir=tmp_path)
    remote = remote_artifact_store(settings)
    assert remote is not None and remote.insecure  # http: endpoint
    assert remote.access_key == ir.SecretRef("couler-artifacts", "accessKey")

    make = ir.Step(name="make", body=ir.ContainerSpec(image="alpine", command=("true",)),
                   output_artifacts=(ir.OutputArtifact("model", "/tmp/model.bin"),))
    use = ir.Step(name="use", body=ir.ContainerSpec(image="alpine", command=("true",)),
                  input_artifacts=(ir.InputArtifact("model", "/in/model.bin",
                                                    ir.StepArtifactRef("make", "model")),),
                  dependencies=(ir.Dependency("make"),))
    done = substitute_cached(ir.Workflow(name="w", steps=(make, use)), {"make": {}},
                             {"make": {"model": digest}}, remote)
    [kept] = done.workflow.steps
    loc = kept.input_artifacts[0].source
    assert isinstance(loc, ir.ArtifactLocation) and loc.endpoint == s3_server.endpoint
    client = Minio(loc.endpoint, access_key=s3_server.access_key,
                   secret_key=s3_server.secret_key, secure=not loc.insecure)
    got = client.get_object(loc.bucket, loc.key)
    try:
        assert got.read() == data.read_bytes()
    finally:
        got.close()
        got.release_conn()

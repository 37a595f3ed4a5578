"""Run a SageMaker Batch Transform over an S3 prefix of prompt files with a trained Sluice model
(the SDK's TransformJob resource), and print each input line beside its output line.

    python examples/sdk/transform.py <training job name> s3://<bucket>/<prefix of .jsonl files>/

Every input line gets one output line, in order (an error line for a malformed record). Files
dropped under `incoming/` of the deployment's bucket are transformed without any of this.
"""

from __future__ import annotations

import sys
import time

from common import create_model, outputs, session
from sagemaker.core.resources import Model, TransformJob
from sagemaker.core.shapes import (
    TransformDataSource,
    TransformInput,
    TransformOutput,
    TransformResources,
    TransformS3DataSource,
)


def split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def main(job_name: str, data: str) -> dict[str, list[tuple[str, str]]]:
    out = outputs()
    boto = session(out).boto_session
    name = f"sluice-sdk-transform-{time.strftime('%Y%m%d%H%M%S')}"
    create_model(name, job_name, out)
    destination = f"s3://{out['DataBucketName']}/sdk/transform/{name}/"
    transform = TransformJob.create(
        transform_job_name=name,
        model_name=name,
        transform_input=TransformInput(
            data_source=TransformDataSource(
                s3_data_source=TransformS3DataSource(s3_data_type="S3Prefix", s3_uri=data)
            ),
            content_type="application/jsonlines",
            split_type="Line",
        ),
        transform_output=TransformOutput(
            s3_output_path=destination,
            accept="application/jsonlines",
            assemble_with="Line",
            kms_key_id=out["DataKeyArn"],
        ),
        # a GPU host with driver 535: the image runs its CUDA 13.0 through forward compatibility
        transform_resources=TransformResources(
            instance_type="ml.g5.xlarge",
            instance_count=1,
            transform_ami_version="al2-ami-sagemaker-batch-gpu-535",
        ),
        batch_strategy="MultiRecord",
        max_payload_in_mb=1,
        session=boto,
    )
    try:
        transform.wait()
        transform.refresh()
        print(f"transform job {name}: {transform.transform_job_status}")
        s3 = boto.client("s3")
        pairs: dict[str, list[tuple[str, str]]] = {}
        bucket, prefix = split(data)
        for obj in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
            source = obj["Key"]
            rel = source[len(prefix) :].lstrip("/")
            ob, ok = split(destination + rel + ".out")
            inputs = s3.get_object(Bucket=bucket, Key=source)["Body"].read().decode().splitlines()
            results = s3.get_object(Bucket=ob, Key=ok)["Body"].read().decode().splitlines()
            pairs[rel] = list(zip(inputs, results, strict=True))
            for i, o in pairs[rel]:
                print(f"{i[:60]:60} -> {o[:100]}")
        return pairs
    finally:
        Model.get(name, session=boto).delete()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Deploy a trained Sluice model to a real-time endpoint and call it, with the SageMaker Python
SDK's resources (Model, EndpointConfig, Endpoint).

    python examples/sdk/deploy.py <training job name> [endpoint name]

Asks it in JSON Lines (one record per line, a task each) and with a plain string (one prompt a
line), then deletes what it created. (Retraining deploys by itself, blue/green, to the
deployment's own endpoint: this one is yours.)
"""

from __future__ import annotations

import json
import sys

from common import create_model, outputs, session
from sagemaker.core.resources import Endpoint, EndpointConfig, Model
from sagemaker.core.shapes import ProductionVariant


def deploy(job_name: str, name: str, out: dict[str, str]) -> Endpoint:
    boto = session(out).boto_session
    create_model(name, job_name, out)
    EndpointConfig.create(
        endpoint_config_name=name,
        production_variants=[
            ProductionVariant(
                variant_name="AllTraffic",
                model_name=name,
                instance_type="ml.g5.xlarge",
                initial_instance_count=1,
                # driver 580: the image's CUDA 13.0 natively (docs/container.md)
                inference_ami_version="al2023-ami-sagemaker-inference-gpu-4-1",
            )
        ],
        # no kms_key_id: ml.g5 has local NVMe storage, which SageMaker encrypts in hardware and
        # refuses a volume key for (CreateEndpointConfig's KmsKeyId)
        session=boto,
    )
    endpoint = Endpoint.create(endpoint_name=name, endpoint_config_name=name, session=boto)
    endpoint.wait_for_status("InService")
    return endpoint


def predict(endpoint: Endpoint, text: str) -> str:
    """A plain string in, the generated continuation out."""
    answer = endpoint.invoke(body=text, content_type="text/plain", accept="application/jsonlines")
    return json.loads(answer.body.read().decode().splitlines()[0])["generated_text"]


def ask(endpoint: Endpoint, records: list[dict]) -> list[dict]:
    """JSON Lines in (one record a line), one answer line per record out, in order."""
    body = "\n".join(json.dumps(r) for r in records)
    answer = endpoint.invoke(
        body=body, content_type="application/jsonlines", accept="application/jsonlines"
    )
    return [json.loads(line) for line in answer.body.read().decode().splitlines()]


def remove(name: str, out: dict[str, str]) -> None:
    boto = session(out).boto_session
    Endpoint.get(name, session=boto).delete()
    EndpointConfig.get(name, session=boto).delete()
    Model.get(name, session=boto).delete()


def main(job_name: str, name: str = "sluice-sdk-endpoint") -> dict:
    out = outputs()
    endpoint = deploy(job_name, name, out)
    try:
        text = predict(endpoint, "The quick brown fox jumps over the")
        print(f"predict: The quick brown fox jumps over the|{text}")
        answers = ask(
            endpoint,
            [
                {"id": "g", "text": "Every horse likes", "parameters": {"max_new_tokens": 5}},
                {"id": "s", "text": "The lazy cat eats fish.", "task": "score"},
                {"id": "n", "text": "In the desert there is", "task": "next_token"},
            ],
        )
        for a in answers:
            print(json.dumps(a))
        return {"predict": text, "answers": answers}
    finally:
        remove(name, out)


if __name__ == "__main__":
    main(*sys.argv[1:])

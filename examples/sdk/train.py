"""Train a Sluice model with the SageMaker Python SDK (v3): ModelTrainer over Sluice's image.

    python examples/sdk/train.py s3://<data bucket>/training/

The hyperparameters are Sluice's (`sluice train --help` lists them); the job prints the metrics
the SDK's MetricDefinitions read. Prints the training job's name and its model artifact.
"""

from __future__ import annotations

import sys

from common import METRICS, outputs, session
from sagemaker.core.training.configs import Compute, InputData, OutputDataConfig, StoppingCondition
from sagemaker.train import ModelTrainer

HYPERPARAMETERS = {  # a tiny model: minutes on a CPU, seconds on a GPU
    "model_size": "tiny",
    "vocab_size": "384",
    "n_positions": "64",
    "block_size": "32",
    "max_steps": "60",
}


def trainer(out: dict[str, str], **hyperparameters: str) -> ModelTrainer:
    """A ModelTrainer for Sluice's image, writing to the deployment's bucket."""
    t = ModelTrainer(
        sagemaker_session=session(out),
        training_image=out["ImageUri"],
        role=out["SageMakerExecutionRoleArn"],
        base_job_name="sluice-sdk",
        compute=Compute(instance_type="ml.g5.2xlarge", instance_count=1, volume_size_in_gb=30),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=3600),
        output_data_config=OutputDataConfig(
            s3_output_path=f"s3://{out['DataBucketName']}/sdk/models/",
            kms_key_id=out["DataKeyArn"],
        ),
        hyperparameters={**HYPERPARAMETERS, **hyperparameters},
    )
    return t.with_metric_definitions(METRICS)


def main(data: str) -> str:
    out = outputs()
    t = trainer(out)
    t.train(input_data_config=[InputData(channel_name="train", data_source=data)], logs=False)
    job = t._latest_training_job
    job.refresh()
    print(f"training job {job.training_job_name}: {job.training_job_status}")
    print(f"model: {job.model_artifacts.s3_model_artifacts}")
    for m in job.final_metric_data_list or []:
        print(f"  {m.metric_name} = {m.value:.4g}")
    return job.training_job_name


if __name__ == "__main__":
    main(sys.argv[1])

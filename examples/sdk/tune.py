"""Tune Sluice's learning rate and warmup with the SageMaker Python SDK's HyperparameterTuner.

    python examples/sdk/tune.py s3://<data bucket>/training/

Each trial is a training job of Sluice's image; the objective is the validation loss every run
prints. Prints the trials, best first. (Retraining can tune by itself: TuningStrategy.)
"""

from __future__ import annotations

import sys

from common import METRICS, outputs
from sagemaker.core.parameter import ContinuousParameter, IntegerParameter
from sagemaker.core.training.configs import InputData
from sagemaker.train.tuner import HyperparameterTuner
from train import trainer


def main(data: str) -> str:
    out = outputs()
    tuner = HyperparameterTuner(
        # the tuned names leave the static hyperparameters (SageMaker refuses both)
        model_trainer=trainer(out),
        objective_metric_name="validation_loss",
        objective_type="Minimize",
        metric_definitions=[{"Name": m.name, "Regex": m.regex} for m in METRICS],
        hyperparameter_ranges={
            "learning_rate": ContinuousParameter(3e-4, 1e-2, scaling_type="Logarithmic"),
            "warmup_steps": IntegerParameter(0, 20),
        },
        strategy="Random",
        max_jobs=2,
        max_parallel_jobs=2,
        base_tuning_job_name="sluice-sdk",
    )
    tuner.tune(inputs=[InputData(channel_name="train", data_source=data)], wait=True)
    job = tuner.describe()
    print(
        f"tuning job {job.hyper_parameter_tuning_job_name}: {job.hyper_parameter_tuning_job_status}"
    )
    trials = (
        tuner.sagemaker_session.sagemaker_client.list_training_jobs_for_hyper_parameter_tuning_job(
            HyperParameterTuningJobName=job.hyper_parameter_tuning_job_name,
            SortBy="FinalObjectiveMetricValue",
            SortOrder="Ascending",
        )["TrainingJobSummaries"]
    )
    for t in trials:
        value = t["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]
        print(f"  {t['TrainingJobName']}: validation_loss {value:.4f} {t['TunedHyperParameters']}")
    best = tuner.best_training_job()
    print(f"best: {best}")
    return best


if __name__ == "__main__":
    main(sys.argv[1])

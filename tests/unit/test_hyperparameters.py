import pytest

from sluice.errors import SluiceError
from sluice.hyperparameters import parse_hyperparameters


def test_strings_are_parsed_to_their_types():
    cfg = parse_hyperparameters(
        {
            "learning_rate": "1e-3",
            "max_steps": "100",
            "export_edge": "False",
            "n_layer": "4",
            "model_size": "tiny",
            "epochs": "2.5",
        }
    )
    assert cfg.learning_rate == 1e-3
    assert cfg.max_steps == 100
    assert cfg.export_edge is False
    assert cfg.n_layer == 4
    assert cfg.epochs == 2.5


def test_json_encoded_values_and_sagemaker_keys():
    # the SageMaker SDK json-encodes values ("\"tiny\"") and adds sagemaker_* keys of its own
    cfg = parse_hyperparameters({"model_size": "tiny", "sagemaker_region": '"us-east-1"'})
    assert cfg.model_size == "tiny"


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"learning_rate": "fast"}, "learning_rate='fast' is not a number"),
        ({"max_steps": "1.5"}, "max_steps='1.5' is not an integer"),
        ({"export_edge": "maybe"}, "export_edge='maybe' is not true or false"),
        ({"lerning_rate": "1"}, "unknown hyperparameter 'lerning_rate'"),
        ({"model_size": "huge"}, "model_size='huge': choose one of"),
        ({"batch_size": "0"}, "batch_size must be positive"),
        ({"validation_fraction": "1.5"}, "validation_fraction must be in [0, 1)"),
        ({"lora_base": "link"}, "lora_base='link': choose one of"),
        (
            {"finetune_method": "lora", "lora_base": "reference"},
            "needs finetune_method=lora and lora_merge=false",
        ),
        ({"lora_base": "reference", "lora_merge": "false"}, "needs finetune_method=lora"),
    ],
)
def test_bad_values_fail_with_a_one_line_reason(raw, message):
    with pytest.raises(SluiceError) as e:
        parse_hyperparameters(raw)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_tuning_trial_keeps_its_artifacts_and_checkpoints_apart(tmp_path):
    from sluice.hyperparameters import for_trial

    raw = {"artifacts_s3_uri": "s3://b/models/t/artifacts/", "_tuning_objective_metric": "x"}
    env = {"TRAINING_JOB_NAME": "t-001-0a1b2c3d"}
    out = for_trial(raw, tmp_path / "checkpoints", env)
    assert out["artifacts_s3_uri"] == "s3://b/models/t/artifacts/t-001-0a1b2c3d/"
    assert env["SM_CHECKPOINT_DIR"] == str(tmp_path / "checkpoints" / "t-001-0a1b2c3d")
    # torchrun's workers inherit the trial's checkpoint folder: not nested twice
    assert for_trial(raw, tmp_path / "checkpoints" / "t-001-0a1b2c3d", env) == out
    assert env["SM_CHECKPOINT_DIR"] == str(tmp_path / "checkpoints" / "t-001-0a1b2c3d")
    # a plain training job (no tuning mark) is left as it is
    plain = {"artifacts_s3_uri": "s3://b/models/j/artifacts/"}
    env = {"TRAINING_JOB_NAME": "j"}
    assert for_trial(plain, tmp_path, env) == plain and "SM_CHECKPOINT_DIR" not in env

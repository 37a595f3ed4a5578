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
    ],
)
def test_bad_values_fail_with_a_one_line_reason(raw, message):
    with pytest.raises(SluiceError) as e:
        parse_hyperparameters(raw)
    assert message in str(e.value)
    assert "\n" not in str(e.value)

"""SageMaker's /opt/ml layout, every path overridable by environment so commands run anywhere.

SageMaker's training toolkit defines the SM_* names; a bring-your-own image derives them itself.
`SLUICE_OPT_ML` moves the whole tree (a laptop run uses a folder instead of /opt/ml).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import SluiceError


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value) if value else default


@dataclass(frozen=True)
class OptML:
    """Resolved paths of one job, following SageMaker's container contract."""

    root: Path

    @classmethod
    def from_env(cls) -> OptML:
        return cls(Path(os.environ.get("SLUICE_OPT_ML", "/opt/ml")))

    @property
    def input_config(self) -> Path:
        return _env_path("SM_INPUT_CONFIG_DIR", self.root / "input" / "config")

    @property
    def hyperparameters_file(self) -> Path:
        return self.input_config / "hyperparameters.json"

    @property
    def resourceconfig_file(self) -> Path:
        return self.input_config / "resourceconfig.json"

    @property
    def data_dir(self) -> Path:
        return _env_path("SM_INPUT_DATA_DIR", self.root / "input" / "data")

    def channel(self, name: str) -> Path:
        """A channel's folder: SM_CHANNEL_<NAME> when set, else /opt/ml/input/data/<name>."""
        return _env_path(f"SM_CHANNEL_{name.upper()}", self.data_dir / name)

    @property
    def model_dir(self) -> Path:
        return _env_path("SM_MODEL_DIR", self.root / "model")

    @property
    def output_dir(self) -> Path:
        return _env_path("SM_OUTPUT_DIR", self.root / "output")

    @property
    def output_data_dir(self) -> Path:
        return _env_path("SM_OUTPUT_DATA_DIR", self.output_dir / "data")

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    @property
    def checkpoint_dir(self) -> Path:
        return _env_path("SM_CHECKPOINT_DIR", self.root / "checkpoints")

    @property
    def work_dir(self) -> Path:
        """Scratch space for tokenised data (on the job's volume, not the small root disk)."""
        return _env_path("SLUICE_WORK_DIR", self.root / "sluice-work")

    def hyperparameters(self) -> dict[str, str]:
        """SageMaker's hyperparameters.json (string to string); empty when absent."""
        doc = _json_file(self.hyperparameters_file, "the job's HyperParameters")
        if doc is not None and not isinstance(doc, dict):
            raise SluiceError(f"{self.hyperparameters_file} must hold a JSON object of names")
        return doc or {}

    def resourceconfig(self) -> dict | None:
        return _json_file(self.resourceconfig_file, "the job's resource configuration")


def _json_file(f: Path, what: str):
    """A JSON file SageMaker writes (None when absent); one clear error when it is not JSON."""
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise SluiceError(f"{f} is not valid JSON ({e}); it should hold {what}") from None

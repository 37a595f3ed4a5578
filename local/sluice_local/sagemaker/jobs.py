"""Training, transform, processing and compilation jobs, run as SageMaker runs them.

Each job gets its own `/opt/ml`-style folder under the state folder, its inputs from (local) S3,
the Sluice image's entrypoint as a process, and its outputs uploaded where the request says.
Status moves InProgress -> Completed | Failed | Stopped with SageMaker's fields
(SecondaryStatusTransitions, FinalMetricDataList, FailureReason, ExitMessage, times), and each
change is published as SageMaker's EventBridge event (api.LocalSageMaker.update).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path

from .api import LocalSageMaker
from .quotas import CAPACITY_ERROR
from .runtime import (
    Container,
    Context,
    now,
    primary_container,
    sluice_command,
    split_s3,
    tar_dir,
)
from .shapes import ApiError

OPT_ML = "/opt/ml"
FAILURE_MAX = 1024  # SageMaker keeps the first 1024 characters of /opt/ml/output/failure


class JobRunner:
    """Runs jobs of one kind in threads; `stop` sends the container SIGTERM."""

    kind = ""
    status_key = ""
    end_key = ""
    start_key = ""
    stop_grace_s = 30
    completed, failed, stopped = "Completed", "Failed", "Stopped"  # compilation: upper case

    def __init__(self, api: LocalSageMaker, ctx: Context):
        self.api, self.ctx = api, ctx
        self.closing = False
        self.containers: dict[str, Container] = {}
        self.stopping: set[str] = set()
        self.threads: dict[str, threading.Thread] = {}

    def folder(self, name: str) -> Path:
        return self.ctx.root / self.kind.lower() / name

    def fresh_folder(self, name: str) -> Path:
        """The job's folder, emptied (a job run again starts clean)."""
        folder = self.folder(name)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def start(self, name: str) -> None:
        t = threading.Thread(
            target=self._guarded, args=(name,), name=f"{self.kind}:{name}", daemon=True
        )
        self.threads[name] = t
        t.start()

    def stop(self, name: str) -> None:
        self.stopping.add(name)
        self.api.update(self.kind, name, **self.stopping_fields())
        container = self.containers.get(name)
        if container is not None:
            container.stop(self.stop_grace_s)

    def stopping_fields(self) -> dict:
        return {self.status_key: "Stopping"}

    def shutdown(self) -> None:
        """The local stack is stopping: end the containers and leave the records as they are
        (InProgress), so the next start reports these jobs as interrupted."""
        self.closing = True
        for name in list(self.containers):
            self.containers[name].stop(5)

    def _guarded(self, name: str) -> None:
        self.api.update(self.kind, name, **{self.start_key: now()})
        self.ctx.say("job", f"{self.kind} {name} InProgress")
        try:
            changes = self.run(name, self.api.get(self.kind, name))
        except Exception as e:  # a local-stack fault is the job's failure, with the reason
            traceback.print_exc(file=sys.stderr)
            changes = {
                self.status_key: self.failed,
                "FailureReason": f"InternalServerError: local SageMaker: {e}"[:FAILURE_MAX],
            }
        finally:
            self.containers.pop(name, None)
        if self.closing:
            return
        if name in self.stopping and changes.get(self.status_key) != self.completed:
            changes[self.status_key] = self.stopped
        self.stopping.discard(name)
        changes[self.end_key] = now()
        record = self.api.update(self.kind, name, **changes)
        status, reason = record[self.status_key], record.get("FailureReason")
        self.ctx.say(
            "job",
            f"{self.kind} {name} {status}"
            + (f": {reason}" if reason and status != self.completed else ""),
        )

    def run(self, name: str, record: dict) -> dict:
        raise NotImplementedError

    def container(self, name: str, argv: list[str], env: dict, log: Path, **kw) -> Container:
        """The Sluice image's entrypoint with `argv` as this job's container."""
        return self.process(name, sluice_command(argv), env, log, **kw)

    def process(self, name: str, cmd: list[str], env: dict, log: Path, **kw) -> Container:
        c = Container(cmd, self.ctx.env(env), log, **kw)
        self.containers[name] = c
        if name in self.stopping:  # StopXJob arrived before the container started
            c.stop(self.stop_grace_s)
        return c


def as_args(flags: dict) -> list[str]:
    """{"--flag": value} as command-line arguments; flags without a value are left out."""
    return [x for flag, value in flags.items() if value is not None for x in (flag, str(value))]


def remap(value: str, root: Path) -> str:
    """A container path (/opt/ml/...) as this job's folder holds it."""
    return str(root) + value[len(OPT_ML) :] if value.startswith(OPT_ML) else value


def failure_text(root: Path, rc: int) -> str:
    failure = root / "output" / "failure"
    text = failure.read_text(errors="replace").strip() if failure.exists() else ""
    return f"AlgorithmError: {text or 'the container failed'}, exit code: {rc}"[:FAILURE_MAX]


# --- training ----------------------------------------------------------------------------------


class TrainingRunner(JobRunner):
    kind, status_key = "TrainingJob", "TrainingJobStatus"
    start_key, end_key = "TrainingStartTime", "TrainingEndTime"
    stop_grace_s = 120  # StopTrainingJob: SIGTERM, SIGKILL 120 s later

    def stopping_fields(self) -> dict:
        return {self.status_key: "Stopping", "SecondaryStatus": "Stopping"}

    def secondary(self, name: str, status: str, message: str) -> None:
        record = self.api.get(self.kind, name)
        transitions = list(record.get("SecondaryStatusTransitions") or [])
        if transitions:
            transitions[-1]["EndTime"] = now()
        transitions.append({"Status": status, "StartTime": now(), "StatusMessage": message})
        self.api.update(
            self.kind, name, SecondaryStatus=status, SecondaryStatusTransitions=transitions
        )

    def run(self, name: str, r: dict) -> dict:
        folder = self.folder(name)
        root = folder / "opt" / "ml"
        for old in [p for p in folder.glob("*") if p.name != "opt"] + [
            p
            for p in root.glob("*")
            if p.name != "checkpoints"  # a resumed job starts from them
        ]:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        config = root / "input" / "config"
        config.mkdir(parents=True)
        resources = r["ResourceConfig"]
        if int(resources.get("InstanceCount", 1)) > 1:
            self.ctx.say(
                "job",
                f"{name}: {resources['InstanceCount']} instances asked; "
                "this machine is one host (algo-1)",
            )
        (config / "hyperparameters.json").write_text(json.dumps(r.get("HyperParameters") or {}))
        (config / "resourceconfig.json").write_text(
            json.dumps(
                {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}
            )
        )
        channels = {
            c["ChannelName"]: {
                "TrainingInputMode": c.get(
                    "InputMode", r["AlgorithmSpecification"].get("TrainingInputMode", "File")
                ),
                "S3DistributionType": c["DataSource"]["S3DataSource"].get(
                    "S3DataDistributionType", "FullyReplicated"
                ),
                "RecordWrapperType": c.get("RecordWrapperType", "None"),
                **({"ContentType": c["ContentType"]} if "ContentType" in c else {}),
            }
            for c in r.get("InputDataConfig", [])
        }
        (config / "inputdataconfig.json").write_text(json.dumps(channels))

        self.secondary(name, "Starting", "Preparing the instances for training")
        self.secondary(name, "Downloading", "Downloading input data")
        for c in r.get("InputDataConfig", []):
            source = c["DataSource"]["S3DataSource"]
            found = self.ctx.download(
                source["S3Uri"],
                root / "input" / "data" / c["ChannelName"],
                source.get("S3DataType", "S3Prefix"),
            )
            if not found:
                return {
                    self.status_key: "Failed",
                    "SecondaryStatus": "Failed",
                    "FailureReason": f"ClientError: no objects under {source['S3Uri']} "
                    f"(channel {c['ChannelName']})",
                }
        checkpoint = r.get("CheckpointConfig")
        local_ckpt = root / "checkpoints"
        if checkpoint:
            local_ckpt = Path(remap(checkpoint.get("LocalPath", f"{OPT_ML}/checkpoints"), root))
            self.ctx.download(checkpoint["S3Uri"], local_ckpt)  # a restarted job resumes

        self.secondary(name, "Training", "Training image download completed. Training in progress.")
        metrics = [
            (d["Name"], re.compile(d["Regex"]))
            for d in r["AlgorithmSpecification"].get("MetricDefinitions", [])
        ]
        final: dict[str, float] = {}

        def scrape(line: str) -> None:  # MetricDefinitions, applied to the log stream
            for metric, rx in metrics:
                m = rx.search(line)
                if m:
                    with contextlib.suppress(ValueError, IndexError):  # a regex without a number
                        final[metric] = float(m.group(1))

        env = {
            **(r.get("Environment") or {}),
            "SLUICE_OPT_ML": str(root),
            "SM_CHECKPOINT_DIR": str(local_ckpt),
            "TRAINING_JOB_NAME": name,
            "TRAINING_JOB_ARN": r["TrainingJobArn"],
        }
        container = self.container(
            name, ["sluice", "train"], env, folder / "job.log", on_line=scrape
        )
        limit = (r.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
        rc = container.wait(float(limit) if limit else None)
        timed_out = rc == -1 and name not in self.stopping
        stamp = now()
        final_list = [{"MetricName": k, "Value": v, "Timestamp": stamp} for k, v in final.items()]

        self.secondary(name, "Uploading", "Uploading generated training model")
        if checkpoint:
            self.ctx.upload_dir(local_ckpt, checkpoint["S3Uri"])
        out = r["OutputDataConfig"]["S3OutputPath"].rstrip("/") + f"/{name}/output"
        changes: dict = {"FinalMetricDataList": final_list}
        model_dir = root / "model"
        if model_dir.exists() and any(model_dir.iterdir()):
            self.ctx.upload_file(tar_dir(model_dir, folder / "model.tar.gz"), f"{out}/model.tar.gz")
            changes["ModelArtifacts"] = {"S3ModelArtifacts": f"{out}/model.tar.gz"}
        data = root / "output" / "data"
        if data.exists() and any(data.iterdir()):
            self.ctx.upload_file(tar_dir(data, folder / "output.tar.gz"), f"{out}/output.tar.gz")
        if rc == 0:
            self.secondary(name, "Completed", "Training job completed")
            return {**changes, self.status_key: "Completed"}
        if timed_out:
            self.secondary(name, "MaxRuntimeExceeded", "Training job ran past MaxRuntimeInSeconds")
            return {**changes, self.status_key: "Stopped", "FailureReason": "MaxRuntimeExceeded"}
        if name in self.stopping:
            self.secondary(name, "Stopped", "Training job stopped")
            return {**changes, self.status_key: "Stopped"}
        self.secondary(name, "Failed", "Training job failed")
        return {**changes, self.status_key: "Failed", "FailureReason": failure_text(root, rc)}


# --- transform ---------------------------------------------------------------------------------


class TransformRunner(JobRunner):
    """A transform job: SageMaker's side is the local driver (`sluice-local transform`), the
    container it calls is the image's real `sluice serve`."""

    kind, status_key = "TransformJob", "TransformJobStatus"
    start_key, end_key = "TransformStartTime", "TransformEndTime"

    def run(self, name: str, r: dict) -> dict:
        if self.api.finds_no_capacity(r["TransformResources"]["InstanceType"]):
            return {self.status_key: "Failed", "FailureReason": CAPACITY_ERROR}
        folder = self.fresh_folder(name)
        container = primary_container(self.api.get("Model", r["ModelName"]))
        model_dir = self.ctx.model_dir(container["ModelDataUrl"])
        source = r["TransformInput"]["DataSource"]["S3DataSource"]
        tin, tout = r["TransformInput"], r["TransformOutput"]
        client = r.get("ModelClientConfig") or {}
        flags = {
            "--model": str(model_dir),
            "--input": source["S3Uri"],
            "--output": tout["S3OutputPath"],
            "--endpoint-url": self.ctx.endpoint_url,
            "--summary": str(folder / "summary.json"),
            "--content-type": tin.get("ContentType", "application/octet-stream"),
            "--accept": tout.get("Accept", "application/octet-stream"),
            "--split-type": tin.get("SplitType", "None"),
            "--assemble-with": tout.get("AssembleWith", "None"),
            "--compression": tin.get("CompressionType", "None"),
            "--join-source": (r.get("DataProcessing") or {}).get("JoinSource", "None"),
            "--strategy": r.get("BatchStrategy"),
            "--max-payload-mb": r.get("MaxPayloadInMB"),
            "--max-concurrent-transforms": r.get("MaxConcurrentTransforms") or None,
            "--invocation-timeout": client.get("InvocationsTimeoutInSeconds", 600),
            "--max-retries": client.get("InvocationsMaxRetries", 3),
        }
        # SageMaker's side of the job (split, batch, call the container, assemble) is the
        # emulator's own driver; the container it calls is the image's real `sluice serve`.
        argv = [sys.executable, "-m", "sluice_local.cli", "transform", *as_args(flags)]
        if source.get("S3DataType") == "ManifestFile":
            argv.append("--manifest")
        if (r.get("DataCaptureConfig") or {}).get("DestinationS3Uri"):
            argv += ["--capture-uri", r["DataCaptureConfig"]["DestinationS3Uri"]]
        for k, v in {
            **(container.get("Environment") or {}),
            **(r.get("Environment") or {}),
        }.items():
            argv += ["--env", f"{k}={v}"]
        rc = self.process(name, argv, {}, folder / "job.log").wait()
        summary_file = folder / "summary.json"
        if rc == 0 and summary_file.exists():
            return {self.status_key: "Completed"}
        if summary_file.exists():
            reason = json.loads(summary_file.read_text()).get("FailureReason") or "failed"
        else:
            tail = (folder / "job.log").read_text(errors="replace").strip().splitlines()[-1:]
            reason = tail[0] if tail else f"exit code {rc}"
        return {self.status_key: "Failed", "FailureReason": f"ClientError: {reason}"[:FAILURE_MAX]}


# --- processing --------------------------------------------------------------------------------


class ProcessingRunner(JobRunner):
    kind, status_key = "ProcessingJob", "ProcessingJobStatus"
    start_key, end_key = "ProcessingStartTime", "ProcessingEndTime"

    def run(self, name: str, r: dict) -> dict:
        folder = self.fresh_folder(name)
        root = folder / "opt" / "ml"
        (root / "output").mkdir(parents=True)
        for inp in r.get("ProcessingInputs", []):
            s3 = inp.get("S3Input")
            if not s3:
                raise ApiError("ValidationException", "only S3 processing inputs run locally")
            self.ctx.download(
                s3["S3Uri"], Path(remap(s3["LocalPath"], root)), s3.get("S3DataType", "S3Prefix")
            )
        outputs = (r.get("ProcessingOutputConfig") or {}).get("Outputs", [])
        for out in outputs:
            Path(remap(out["S3Output"]["LocalPath"], root)).mkdir(parents=True, exist_ok=True)
        app = r["AppSpecification"]
        argv = [
            remap(a, root)
            for a in [
                *(app.get("ContainerEntrypoint") or []),
                *(app.get("ContainerArguments") or []),
            ]
        ]
        message = root / "output" / "message"
        env = {k: remap(v, root) for k, v in (r.get("Environment") or {}).items()}
        env.update(
            SLUICE_OPT_ML=str(root),
            SLUICE_MESSAGE_FILE=str(message),
            SLUICE_METRICS_DIR=str(root / "output" / "metrics" / "cloudwatch"),
        )
        limit = (r.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
        rc = self.container(name, argv, env, folder / "job.log").wait(
            float(limit) if limit else None
        )
        exit_message = (
            message.read_text(errors="replace").strip()[:1024] if message.exists() else ""
        )
        changes: dict = {"ExitMessage": exit_message} if exit_message else {}
        if rc != 0:
            why = exit_message or failure_text(root, rc)
            return {
                **changes,
                self.status_key: "Failed",
                "FailureReason": f"AlgorithmError: {why}, exit code: {rc}"[:FAILURE_MAX],
            }
        for out in outputs:
            self.ctx.upload_dir(
                Path(remap(out["S3Output"]["LocalPath"], root)), out["S3Output"]["S3Uri"]
            )
        return {**changes, self.status_key: "Completed"}


# --- compilation -------------------------------------------------------------------------------


class CompilationRunner(JobRunner):
    """Neo's part: the TorchScript export is loaded and run at the declared input shape and
    dtype, then packed as the compiled artifact; what Neo would refuse is refused here."""

    kind, status_key = "CompilationJob", "CompilationJobStatus"
    start_key, end_key = "CompilationStartTime", "CompilationEndTime"
    completed, failed, stopped = "COMPLETED", "FAILED", "STOPPED"

    def stopping_fields(self) -> dict:
        return {self.status_key: "STOPPING"}

    def run(self, name: str, r: dict) -> dict:
        folder = self.fresh_folder(name)
        cfg, out = r["InputConfig"], r["OutputConfig"]
        archive = folder / "input.tar.gz"
        try:
            self.ctx.s3.download_file(*split_s3(cfg["S3Uri"]), str(archive))
        except Exception as e:
            return {
                self.status_key: self.failed,
                "FailureReason": f"ClientError: cannot read {cfg['S3Uri']}: {e}",
            }
        target = out.get("TargetDevice") or (out.get("TargetPlatform") or {}).get("Os", "")
        compiled = folder / f"model-{target}.tar.gz"
        flags = {
            "--framework": cfg.get("Framework", ""),
            "--framework-version": cfg.get("FrameworkVersion", ""),
            "--data-input-config": cfg.get("DataInputConfig", "{}"),
            "--compiler-options": out.get("CompilerOptions", "{}"),
            "--target": target,
        }
        neo = [sys.executable, "-m", "sluice_local.sagemaker.neo", str(archive), str(compiled)]
        cmd = [*neo, *as_args(flags)]
        limit = float((r.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds", 900))
        rc = self.process(name, cmd, {}, folder / "job.log").wait(limit)
        if rc != 0:
            lines = (folder / "job.log").read_text(errors="replace").strip().splitlines()
            reason = next(
                (ln for ln in reversed(lines) if ln.startswith("ClientError")),
                lines[-1] if lines else f"exit code {rc}",
            )
            return {self.status_key: self.failed, "FailureReason": reason[:FAILURE_MAX]}
        location = out["S3OutputLocation"].rstrip("/") + "/" + compiled.name
        self.ctx.upload_file(compiled, location)
        return {self.status_key: self.completed, "ModelArtifacts": {"S3ModelArtifacts": location}}


def resume(runners: list[JobRunner]) -> list[str]:
    """After a restart: jobs that were running when the stack stopped run again (on SageMaker
    they would have carried on); a training job resumes from its local checkpoints."""
    resumed = []
    for runner in runners:
        for name, r in list(runner.api.resources[runner.kind].items()):
            if r.get(runner.status_key) in (
                "InProgress",
                "Stopping",
                "INPROGRESS",
                "STARTING",
                "STOPPING",
            ):
                runner.start(name)
                resumed.append(f"{runner.kind} {name}")
    return resumed


def wait_idle(runners: list[JobRunner], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    for runner in runners:
        for t in list(runner.threads.values()):
            t.join(timeout=max(0.0, deadline - time.monotonic()))

"""Create the transformed template's resources on the local stack, in dependency order.

What `sam deploy` asks CloudFormation to do, done here with the services' own APIs against the
local endpoint: buckets (with their notifications to queues), queues, topics, tables, the SSM
parameter, keys, roles, log groups, alarms, rules and schedules go to moto; the model package
group to the local SageMaker; functions, their SQS event sources and the rules' and schedules'
Lambda targets to the in-process runtime. A type with no local equivalent is reported by name.

Deploying again (a restart) converges: what exists is kept (an SSM parameter keeps the model
retraining put there), what changed in the template is updated where the service allows it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from botocore.exceptions import ClientError, ParamValidationError

from . import ACCOUNT, REGION, aws_rules
from .template import Resolver, TemplateError, Transformed, Unresolved, render_definition


@dataclass
class FunctionSpec:
    """A Lambda function as the template defines it, for the in-process runtime."""

    logical_id: str
    name: str
    handler: str
    code_dir: Path
    environment: dict[str, str]
    timeout_s: int
    memory_mb: int
    dead_letter_arn: str | None = None
    reserved_concurrency: int | None = None  # ReservedConcurrentExecutions: None, unreserved

    @property
    def arn(self) -> str:
        return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{self.name}"


@dataclass
class EventSource:
    """An SQS event source mapping (Lambda's poller, played by the local stack)."""

    logical_id: str
    queue_arn: str
    function: str
    batch_size: int = 10
    window_s: int = 0
    report_failures: bool = False
    max_concurrency: int | None = None
    enabled: bool = True


@dataclass
class Deployment:
    resources: dict[str, dict] = field(default_factory=dict)  # id -> {"Type", "Ref", attrs...}
    functions: dict[str, FunctionSpec] = field(default_factory=dict)  # by function name
    event_sources: list[EventSource] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # {"id", "type", "why"}
    outputs: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"resources": self.resources, "skipped": self.skipped, "outputs": self.outputs}


def send_to(client, arn: str, body: str, **attributes) -> None:
    """Deliver a message to an SQS queue or SNS topic named by its ARN (targets, DLQs)."""
    name = arn.rsplit(":", 1)[1]
    if ":sqs:" in arn:
        url = client("sqs").get_queue_url(QueueName=name)["QueueUrl"]
        client("sqs").send_message(QueueUrl=url, MessageBody=body, **attributes)
    else:
        client("sns").publish(TopicArn=arn, Message=body)


# Types whose job the local stack does without creating anything.
RECORDED_ONLY = {
    "AWS::Lambda::Permission": "invocation permissions: IAM is not enforced locally",
}


class Deployer:
    """Creates one template's resources through `client(service)` (boto3, local endpoint)."""

    def __init__(
        self,
        transformed: Transformed,
        client: Callable,
        stack_name: str,
        previous: dict | None = None,
    ):
        self.t = transformed
        self.client = client
        self.stack_name = stack_name
        self.previous = (previous or {}).get("resources", {})
        template = transformed.template
        self.resolver = Resolver(
            transformed.parameters, template.get("Conditions") or {}, stack_name=stack_name
        )
        self.out = Deployment()
        self.visibility: dict[str, int] = {}  # queue ARN -> VisibilityTimeout, as created
        self.creators: dict[str, Callable[[str, dict], dict]] = {
            "AWS::KMS::Key": self.kms_key,
            "AWS::KMS::Alias": self.kms_alias,
            "AWS::S3::Bucket": self.bucket,
            "AWS::S3::BucketPolicy": self.bucket_policy,
            "AWS::SQS::Queue": self.queue,
            "AWS::SQS::QueuePolicy": self.queue_policy,
            "AWS::SNS::Topic": self.topic,
            "AWS::SNS::TopicPolicy": self.topic_policy,
            "AWS::SNS::Subscription": self.subscription,
            "AWS::DynamoDB::Table": self.table,
            "AWS::SSM::Parameter": self.parameter,
            "AWS::IAM::Role": self.role,
            "AWS::IAM::ManagedPolicy": self.managed_policy,
            "AWS::Logs::LogGroup": self.log_group,
            "AWS::CloudWatch::Alarm": self.alarm,
            "AWS::CloudWatch::Dashboard": self.dashboard,
            "AWS::Events::Rule": self.rule,
            "AWS::Scheduler::Schedule": self.schedule,
            "AWS::StepFunctions::StateMachine": self.state_machine,
            "AWS::SageMaker::ModelPackageGroup": self.model_package_group,
            "AWS::Lambda::Function": self.function,
            "AWS::Lambda::EventSourceMapping": self.event_source,
        }

    # --- the walk -------------------------------------------------------------------------------

    def deploy(self) -> Deployment:
        resources = self.t.template.get("Resources") or {}
        pending = {}
        for rid, res in resources.items():
            cond = res.get("Condition")
            if cond and not self.resolver.condition(cond):
                continue  # not part of this deployment (as CloudFormation would skip it)
            kind = res["Type"]
            if kind in RECORDED_ONLY:
                self.out.skipped.append({"id": rid, "type": kind, "why": RECORDED_ONLY[kind]})
                self.resolver.resources[rid] = {"Type": kind, "Ref": rid}
                continue
            if kind not in self.creators:
                self.out.skipped.append(
                    {"id": rid, "type": kind, "why": "no local equivalent: not created"}
                )
                continue
            pending[rid] = res
        while pending:
            progressed = False
            for rid in list(pending):
                res = pending[rid]
                depends = res.get("DependsOn") or []
                depends = [depends] if isinstance(depends, str) else depends
                if any(d in pending for d in depends):
                    continue
                try:
                    props = self.resolver.resolve(res.get("Properties") or {})
                except Unresolved:
                    continue
                try:
                    made = self.creators[res["Type"]](rid, props)
                except (ClientError, ParamValidationError) as e:
                    raise TemplateError(f"{rid} ({res['Type']}): {e}") from e
                made["Type"] = res["Type"]
                self.resolver.resources[rid] = made
                self.out.resources[rid] = made
                del pending[rid]
                progressed = True
            if not progressed:
                raise TemplateError(f"cannot resolve references of {sorted(pending)}")
        for name, spec in (self.t.template.get("Outputs") or {}).items():
            cond = spec.get("Condition")
            if cond and not self.resolver.condition(cond):
                continue
            self.out.outputs[name] = self.resolver.resolve(spec["Value"])
        return self.out

    def register_stack(self) -> None:
        """CloudFormation's DescribeStacks answers with this deployment's outputs, as it does
        for a stack `sam deploy` made: clients (examples/sdk) find the role, bucket and endpoint
        the same way on AWS and here. The stack itself holds one placeholder resource; it is
        made anew at every start (its resources are the ones this deployer created)."""
        cf = self.client("cloudformation")
        body = {
            "Description": "local Sluice: outputs of the deployment sluice-local made",
            "Resources": {"Deployed": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
            "Outputs": {k: {"Value": str(v)} for k, v in self.out.outputs.items()},
        }
        with contextlib.suppress(ClientError):
            cf.delete_stack(StackName=self.stack_name)
        cf.create_stack(StackName=self.stack_name, TemplateBody=json.dumps(body))

    def _previous(self, rid: str) -> dict | None:
        return self.previous.get(rid)

    def _name(self, rid: str, limit: int = 64) -> str:
        """A physical name for an unnamed resource, stable across deployments."""
        name = f"{self.stack_name}-{rid}"
        if len(name) > limit:
            digest = hashlib.sha256(name.encode()).hexdigest()[:8]
            name = name[: limit - 9] + "-" + digest
        return name

    # --- creators: each returns {"Ref": ..., attribute: ...} ------------------------------------

    def kms_key(self, rid: str, p: dict) -> dict:
        kms = self.client("kms")
        prev = self._previous(rid)
        if prev:
            try:
                kms.describe_key(KeyId=prev["Ref"])
                return {"Ref": prev["Ref"], "Arn": prev["Arn"], "KeyId": prev["Ref"]}
            except ClientError:
                pass
        key = kms.create_key(
            Description=p.get("Description", ""),
            Policy=json.dumps(p.get("KeyPolicy", {})),
        )["KeyMetadata"]
        if p.get("EnableKeyRotation"):
            kms.enable_key_rotation(KeyId=key["KeyId"])
        return {"Ref": key["KeyId"], "Arn": key["Arn"], "KeyId": key["KeyId"]}

    def kms_alias(self, rid: str, p: dict) -> dict:
        kms = self.client("kms")
        aliases = {a["AliasName"] for a in kms.list_aliases()["Aliases"]}
        if p["AliasName"] in aliases:
            kms.update_alias(AliasName=p["AliasName"], TargetKeyId=p["TargetKeyId"])
        else:
            kms.create_alias(AliasName=p["AliasName"], TargetKeyId=p["TargetKeyId"])
        return {"Ref": p["AliasName"]}

    def bucket(self, rid: str, p: dict) -> dict:
        s3 = self.client("s3")
        name = p.get("BucketName") or self._name(rid, 63).lower()
        try:
            s3.head_bucket(Bucket=name)
        except ClientError:
            s3.create_bucket(Bucket=name)
        if "VersioningConfiguration" in p:
            s3.put_bucket_versioning(
                Bucket=name,
                VersioningConfiguration={"Status": p["VersioningConfiguration"]["Status"]},
            )
        if "BucketEncryption" in p:
            rules = [
                {
                    "ApplyServerSideEncryptionByDefault": r["ServerSideEncryptionByDefault"],
                    **(
                        {"BucketKeyEnabled": bool(r["BucketKeyEnabled"])}
                        if "BucketKeyEnabled" in r
                        else {}
                    ),
                }
                for r in p["BucketEncryption"]["ServerSideEncryptionConfiguration"]
            ]
            s3.put_bucket_encryption(
                Bucket=name, ServerSideEncryptionConfiguration={"Rules": rules}
            )
        if "PublicAccessBlockConfiguration" in p:
            s3.put_public_access_block(
                Bucket=name, PublicAccessBlockConfiguration=p["PublicAccessBlockConfiguration"]
            )
        if "LifecycleConfiguration" in p:
            s3.put_bucket_lifecycle_configuration(
                Bucket=name,
                LifecycleConfiguration={
                    "Rules": [_lifecycle_rule(r) for r in p["LifecycleConfiguration"]["Rules"]]
                },
            )
        if "NotificationConfiguration" in p:
            s3.put_bucket_notification_configuration(
                Bucket=name,
                NotificationConfiguration=_notifications(p["NotificationConfiguration"]),
            )
        arn = f"arn:aws:s3:::{name}"
        return {
            "Ref": name,
            "Arn": arn,
            "DomainName": f"{name}.s3.amazonaws.com",
            "RegionalDomainName": f"{name}.s3.{REGION}.amazonaws.com",
        }

    def bucket_policy(self, rid: str, p: dict) -> dict:
        self.client("s3").put_bucket_policy(
            Bucket=p["Bucket"], Policy=json.dumps(p["PolicyDocument"])
        )
        return {"Ref": rid}

    def queue(self, rid: str, p: dict) -> dict:
        sqs = self.client("sqs")
        name = p.get("QueueName") or self._name(rid, 80)
        attrs = {
            k: (json.dumps(v) if isinstance(v, dict) else str(v))
            for k, v in p.items()
            if k in QUEUE_ATTRIBUTES
        }
        try:
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            sqs.set_queue_attributes(QueueUrl=url, Attributes=attrs)
        except ClientError:
            url = sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]
        arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
        self.visibility[arn] = int(p.get("VisibilityTimeout", 30))  # SQS's default
        return {"Ref": url, "Arn": arn, "QueueName": name, "QueueUrl": url}

    def queue_policy(self, rid: str, p: dict) -> dict:
        for url in p["Queues"]:
            self.client("sqs").set_queue_attributes(
                QueueUrl=url, Attributes={"Policy": json.dumps(p["PolicyDocument"])}
            )
        return {"Ref": rid}

    def topic(self, rid: str, p: dict) -> dict:
        name = p.get("TopicName") or self._name(rid, 256)
        attrs = {"KmsMasterKeyId": p["KmsMasterKeyId"]} if p.get("KmsMasterKeyId") else {}
        arn = self.client("sns").create_topic(Name=name, Attributes=attrs)["TopicArn"]
        return {"Ref": arn, "TopicArn": arn, "TopicName": name}

    def topic_policy(self, rid: str, p: dict) -> dict:
        for arn in p["Topics"]:
            self.client("sns").set_topic_attributes(
                TopicArn=arn, AttributeName="Policy", AttributeValue=json.dumps(p["PolicyDocument"])
            )
        return {"Ref": rid}

    def subscription(self, rid: str, p: dict) -> dict:
        arn = self.client("sns").subscribe(
            TopicArn=p["TopicArn"],
            Protocol=p["Protocol"],
            Endpoint=p["Endpoint"],
            ReturnSubscriptionArn=True,
        )["SubscriptionArn"]
        return {"Ref": arn}

    def table(self, rid: str, p: dict) -> dict:
        ddb = self.client("dynamodb")
        name = p.get("TableName") or self._name(rid, 255)
        try:
            desc = ddb.describe_table(TableName=name)["Table"]
        except ClientError:
            request = {
                k: p[k]
                for k in (
                    "AttributeDefinitions",
                    "KeySchema",
                    "BillingMode",
                    "GlobalSecondaryIndexes",
                    "ProvisionedThroughput",
                )
                if k in p
            }
            if "SSESpecification" in p:
                sse = p["SSESpecification"]
                request["SSESpecification"] = {
                    "Enabled": bool(sse.get("SSEEnabled")),
                    **({"SSEType": sse["SSEType"]} if "SSEType" in sse else {}),
                    **(
                        {"KMSMasterKeyId": sse["KMSMasterKeyId"]} if "KMSMasterKeyId" in sse else {}
                    ),
                }
            desc = ddb.create_table(TableName=name, **request)["TableDescription"]
            ttl = p.get("TimeToLiveSpecification")
            if ttl:
                ddb.update_time_to_live(TableName=name, TimeToLiveSpecification=ttl)
        return {"Ref": name, "Arn": desc["TableArn"], "StreamArn": desc.get("LatestStreamArn", "")}

    def parameter(self, rid: str, p: dict) -> dict:
        ssm = self.client("ssm")
        name = p.get("Name") or f"/{self._name(rid)}"
        try:
            ssm.get_parameter(Name=name)  # kept: retraining moves it; a redeploy must not reset it
        except ClientError:
            ssm.put_parameter(
                Name=name,
                Value=str(p["Value"]),
                Type=p.get("Type", "String"),
                Description=p.get("Description", ""),
            )
        return {"Ref": name, "Type": p.get("Type", "String"), "Value": p["Value"]}

    def role(self, rid: str, p: dict) -> dict:
        iam = self.client("iam")
        name = p.get("RoleName") or self._name(rid)
        try:
            arn = iam.get_role(RoleName=name)["Role"]["Arn"]
            iam.update_assume_role_policy(
                RoleName=name, PolicyDocument=json.dumps(p["AssumeRolePolicyDocument"])
            )
        except ClientError:
            arn = iam.create_role(
                RoleName=name,
                Path=p.get("Path", "/"),
                AssumeRolePolicyDocument=json.dumps(p["AssumeRolePolicyDocument"]),
            )["Role"]["Arn"]
        for policy in p.get("Policies", []):
            # SAM writes some documents without a Version, which IAM reads as 2008-10-17 and
            # moto refuses; IAM is not enforced locally, so the newer version is as good
            doc = {"Version": "2012-10-17", **policy["PolicyDocument"]}
            iam.put_role_policy(
                RoleName=name, PolicyName=policy["PolicyName"], PolicyDocument=json.dumps(doc)
            )
        # managed policies (AWSLambdaBasicExecutionRole, ...) are not attached: moto does not
        # carry AWS's managed policies, and IAM is not enforced locally anyway
        return {"Ref": name, "Arn": arn, "RoleId": name}

    def managed_policy(self, rid: str, p: dict) -> dict:
        """A customer-managed policy (kept for the record: IAM is not enforced locally)."""
        iam = self.client("iam")
        name = p.get("ManagedPolicyName") or self._name(rid, 128)
        arn = f"arn:aws:iam::{ACCOUNT}:policy{p.get('Path', '/')}{name}"
        doc = json.dumps(p["PolicyDocument"])
        try:
            iam.get_policy(PolicyArn=arn)
        except ClientError:
            iam.create_policy(PolicyName=name, Path=p.get("Path", "/"), PolicyDocument=doc)
        else:  # a redeploy: the template's document becomes the default (IAM keeps at most 5)
            for v in iam.list_policy_versions(PolicyArn=arn)["Versions"]:
                if not v["IsDefaultVersion"]:
                    iam.delete_policy_version(PolicyArn=arn, VersionId=v["VersionId"])
            iam.create_policy_version(PolicyArn=arn, PolicyDocument=doc, SetAsDefault=True)
        return {"Ref": arn, "PolicyArn": arn}

    def log_group(self, rid: str, p: dict) -> dict:
        logs = self.client("logs")
        name = p.get("LogGroupName") or self._name(rid, 512)
        existing = logs.describe_log_groups(logGroupNamePrefix=name)["logGroups"]
        if not any(g["logGroupName"] == name for g in existing):
            logs.create_log_group(logGroupName=name)
        if "RetentionInDays" in p:
            logs.put_retention_policy(logGroupName=name, retentionInDays=int(p["RetentionInDays"]))
        return {"Ref": name, "Arn": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{name}:*"}

    def alarm(self, rid: str, p: dict) -> dict:
        name = p.get("AlarmName") or self._name(rid, 255)
        request = {k: p[k] for k in ALARM_FIELDS if k in p}
        for k in ("Period", "EvaluationPeriods", "DatapointsToAlarm"):
            if k in request:
                request[k] = int(request[k])
        if "Threshold" in request:
            request["Threshold"] = float(request["Threshold"])
        for query in request.get("Metrics", []):  # metric math: CloudFormation's strings to ints
            for part in (query, query.get("MetricStat") or {}):
                if "Period" in part:
                    part["Period"] = int(part["Period"])
            if "ReturnData" in query:
                query["ReturnData"] = str(query["ReturnData"]).lower() == "true"
        self.client("cloudwatch").put_metric_alarm(AlarmName=name, **request)
        return {"Ref": name, "Arn": f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{name}"}

    def dashboard(self, rid: str, p: dict) -> dict:
        name = p.get("DashboardName") or self._name(rid, 255)
        self.client("cloudwatch").put_dashboard(
            DashboardName=name, DashboardBody=p["DashboardBody"]
        )
        return {"Ref": name}

    def rule(self, rid: str, p: dict) -> dict:
        events = self.client("events")
        name = p.get("Name") or self._name(rid, 64)
        request = {"Name": name, "State": p.get("State", "ENABLED")}
        if "EventPattern" in p:
            request["EventPattern"] = json.dumps(p["EventPattern"])
        if "ScheduleExpression" in p:
            request["ScheduleExpression"] = p["ScheduleExpression"]
        if p.get("Description"):
            request["Description"] = p["Description"]
        arn = events.put_rule(**request)["RuleArn"]
        targets = [_target(t) for t in p.get("Targets", [])]
        if targets:
            events.put_targets(Rule=name, Targets=targets)
        return {"Ref": name, "Arn": arn}

    def schedule(self, rid: str, p: dict) -> dict:
        scheduler = self.client("scheduler")
        name = p.get("Name") or self._name(rid, 64)
        target = dict(p["Target"])
        if "RetryPolicy" in target:
            target["RetryPolicy"] = {k: int(v) for k, v in target["RetryPolicy"].items()}
        request = {
            "Name": name,
            "ScheduleExpression": p["ScheduleExpression"],
            "FlexibleTimeWindow": p.get("FlexibleTimeWindow", {"Mode": "OFF"}),
            "Target": target,
            "State": p.get("State", "ENABLED"),
        }
        try:
            scheduler.get_schedule(Name=name)
            arn = scheduler.update_schedule(**request)["ScheduleArn"]
        except ClientError:
            arn = scheduler.create_schedule(**request)["ScheduleArn"]
        return {"Ref": name, "Arn": arn}

    def state_machine(self, rid: str, p: dict) -> dict:
        sfn = self.client("stepfunctions")
        name = p.get("StateMachineName") or self._name(rid, 80)
        if "DefinitionS3Location" in p:
            path = self.t.local_file(p["DefinitionS3Location"])
            if path is None:
                raise TemplateError(f"{rid}: only local DefinitionUri files are supported locally")
            text = path.read_text()
        elif "DefinitionString" in p:
            text = p["DefinitionString"]
        else:
            text = json.dumps(p["Definition"])
        text, missing = render_definition(text, p.get("DefinitionSubstitutions") or {})
        if missing:
            raise TemplateError(f"{rid}: undefined substitutions {sorted(set(missing))}")
        arn = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{name}"
        try:
            sfn.describe_state_machine(stateMachineArn=arn)
            sfn.update_state_machine(stateMachineArn=arn, definition=text, roleArn=p["RoleArn"])
        except ClientError as e:
            if "does not exist" not in str(e) and "StateMachineDoesNotExist" not in str(e):
                raise
            sfn.create_state_machine(
                name=name,
                definition=text,
                roleArn=p["RoleArn"],
                type=p.get("StateMachineType", "STANDARD"),
            )
        return {"Ref": arn, "Arn": arn, "Name": name}

    def model_package_group(self, rid: str, p: dict) -> dict:
        sm = self.client("sagemaker")
        name = p["ModelPackageGroupName"]
        try:
            arn = sm.describe_model_package_group(ModelPackageGroupName=name)[
                "ModelPackageGroupArn"
            ]
        except ClientError:
            arn = sm.create_model_package_group(
                ModelPackageGroupName=name,
                ModelPackageGroupDescription=p.get("ModelPackageGroupDescription", ""),
            )["ModelPackageGroupArn"]
        return {"Ref": arn, "ModelPackageGroupArn": arn}

    def function(self, rid: str, p: dict) -> dict:
        name = p.get("FunctionName") or self._name(rid, 64)
        code = self.t.local_file(p.get("Code") or {})
        if code is None:
            raise TemplateError(f"{rid}: only local CodeUri folders run locally")
        spec = FunctionSpec(
            logical_id=rid,
            name=name,
            handler=p["Handler"],
            code_dir=code,
            environment={
                k: str(v) for k, v in ((p.get("Environment") or {}).get("Variables") or {}).items()
            },
            timeout_s=int(p.get("Timeout", 3)),
            memory_mb=int(p.get("MemorySize", 128)),
            dead_letter_arn=(p.get("DeadLetterConfig") or {}).get("TargetArn"),
            reserved_concurrency=(
                int(p["ReservedConcurrentExecutions"])
                if p.get("ReservedConcurrentExecutions") is not None
                else None
            ),
        )
        self.out.functions[name] = spec
        return {"Ref": name, "Arn": spec.arn}

    def event_source(self, rid: str, p: dict) -> dict:
        arn = p["EventSourceArn"]
        if ":sqs:" not in arn:
            self.out.skipped.append(
                {
                    "id": rid,
                    "type": "AWS::Lambda::EventSourceMapping",
                    "why": f"only SQS event sources run locally ({arn})",
                }
            )
            return {"Ref": rid}
        scaling = p.get("ScalingConfig") or {}
        self._check_mapping(rid, p)
        self.out.event_sources.append(
            EventSource(
                logical_id=rid,
                queue_arn=arn,
                function=p["FunctionName"].split(":")[-1],
                batch_size=int(p.get("BatchSize", 10)),
                window_s=int(p.get("MaximumBatchingWindowInSeconds", 0)),
                report_failures="ReportBatchItemFailures" in (p.get("FunctionResponseTypes") or []),
                max_concurrency=int(scaling["MaximumConcurrency"]) if scaling else None,
                enabled=p.get("Enabled", True) not in (False, "false"),
            )
        )
        return {"Ref": hashlib.sha256(rid.encode()).hexdigest()[:36]}

    def _check_mapping(self, rid: str, p: dict) -> None:
        """CreateEventSourceMapping as Lambda checks it: its service model and its documented
        rules (sluice_local.aws_rules), with the queue and function this deployment made."""
        from .validation import input_shape, message, shape_problems

        request = {
            k: p[k]
            for k in (
                "EventSourceArn",
                "FunctionName",
                "BatchSize",
                "MaximumBatchingWindowInSeconds",
                "FunctionResponseTypes",
                "ScalingConfig",
                "Enabled",
            )
            if k in p
        }
        for k in ("BatchSize", "MaximumBatchingWindowInSeconds"):
            if k in request:
                request[k] = int(request[k])
        if "ScalingConfig" in request:
            request["ScalingConfig"] = {k: int(v) for k, v in request["ScalingConfig"].items()}
        op = "CreateEventSourceMapping"
        found = shape_problems(request, input_shape("lambda", op)) + aws_rules.problems(
            "lambda", op, request, world=_DeployedWorld(self)
        )
        if found:
            raise TemplateError(
                f"{rid} (AWS::Lambda::EventSourceMapping): Lambda would refuse it: "
                + message(found)
            )


class _DeployedWorld(aws_rules.Unknown):
    """What Lambda knows when it creates an event source mapping: the queue and the function."""

    def __init__(self, deployer: Deployer):
        self.d = deployer

    def queue_visibility_timeout(self, queue_arn: str) -> int | None:
        return self.d.visibility.get(queue_arn)

    def function_timeout(self, function: str) -> int | None:
        spec = self.d.out.functions.get(function.split(":")[-1])
        return None if spec is None else spec.timeout_s


QUEUE_ATTRIBUTES = {
    "VisibilityTimeout",
    "MessageRetentionPeriod",
    "DelaySeconds",
    "MaximumMessageSize",
    "ReceiveMessageWaitTimeSeconds",
    "RedrivePolicy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "FifoQueue",
    "ContentBasedDeduplication",
}
ALARM_FIELDS = (
    "AlarmDescription",
    "Namespace",
    "MetricName",
    "Dimensions",
    "Statistic",
    "Period",
    "EvaluationPeriods",
    "DatapointsToAlarm",
    "Threshold",
    "ComparisonOperator",
    "TreatMissingData",
    "AlarmActions",
    "OKActions",
    "InsufficientDataActions",
    "Metrics",
)


def _notifications(cfn: dict) -> dict:
    """CloudFormation's NotificationConfiguration in the shape the S3 API takes."""

    def one(c: dict, arn_key: str, api_key: str) -> dict:
        out = {api_key: c[arn_key], "Events": [c["Event"]]}
        rules = ((c.get("Filter") or {}).get("S3Key") or {}).get("Rules")
        if rules:
            out["Filter"] = {"Key": {"FilterRules": rules}}
        return out

    return {
        "QueueConfigurations": [
            one(c, "Queue", "QueueArn") for c in cfn.get("QueueConfigurations", [])
        ],
        "TopicConfigurations": [
            one(c, "Topic", "TopicArn") for c in cfn.get("TopicConfigurations", [])
        ],
        "LambdaFunctionConfigurations": [
            one(c, "Function", "LambdaFunctionArn") for c in cfn.get("LambdaConfigurations", [])
        ],
        **({"EventBridgeConfiguration": {}} if "EventBridgeConfiguration" in cfn else {}),
    }


def _lifecycle_rule(rule: dict) -> dict:
    """A CloudFormation lifecycle rule in the S3 API's shape."""
    out: dict = {
        "ID": rule.get("Id", "rule"),
        "Status": rule["Status"],
        "Filter": {"Prefix": rule.get("Prefix", "")},
    }
    if "ExpirationInDays" in rule:
        out["Expiration"] = {"Days": int(rule["ExpirationInDays"])}
    if "NoncurrentVersionExpiration" in rule:
        out["NoncurrentVersionExpiration"] = {
            "NoncurrentDays": int(rule["NoncurrentVersionExpiration"]["NoncurrentDays"])
        }
    if "AbortIncompleteMultipartUpload" in rule:
        days = int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
        out["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
    return out


def _target(t: dict) -> dict:
    """An EventBridge rule target in the PutTargets shape."""
    out = {"Id": t["Id"], "Arn": t["Arn"]}
    for k in ("Input", "InputPath", "RoleArn"):
        if k in t:
            out[k] = t[k]
    if "RetryPolicy" in t:
        out["RetryPolicy"] = {k: int(v) for k, v in t["RetryPolicy"].items()}
    if "DeadLetterConfig" in t:
        out["DeadLetterConfig"] = t["DeadLetterConfig"]
    return out

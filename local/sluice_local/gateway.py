"""One local endpoint for every AWS API the application and its users call.

Requests go to moto's server application, except what the local stack answers itself:
- SageMaker's control plane for the operations the local SageMaker runs (sagemaker/api.py);
- sagemaker-runtime InvokeEndpoint (sagemaker/endpoints.py);
- Lambda Invoke and ListFunctions (the in-process functions);
- EventBridge PutEvents (the local bus, which runs Lambda and Step Functions targets);
- `/_sluice/...`: the local stack's own status and on-demand schedules.
SNS Publish and S3 writes pass through to moto and are written to the event log on the way.
A request that changes moto's state is answered only once that change is on disk
(durability.py): what the stack acknowledged survives `kill -9`.
"""

from __future__ import annotations

import io
import json
import re
import traceback
import uuid
from urllib.parse import parse_qs, unquote

from . import persist
from .events import event
from .sagemaker.shapes import ApiError

RUNTIME = re.compile(r"^/endpoints/([^/]+)/invocations$")
LAMBDA_INVOKE = re.compile(r"^/2015-03-31/functions/([^/]+)/invocations$")
LAMBDA_LIST = re.compile(r"^/2015-03-31/functions/?$")
# operations that change nothing worth a snapshot (a received message only becomes invisible
# for a while; a crash makes it visible again, as its consumer's death would on AWS)
# query parameters of S3 requests that create or delete objects, never change existing ones
S3_NEW = {"x-id", "uploadId", "partNumber", "uploads", "versionId", "delete"}
READS = (
    "Describe",
    "List",
    "Get",
    "Receive",
    "Head",
    "Query",
    "Scan",
    "BatchGet",
    "Lookup",
    "Filter",
    "Search",
    "Test",
    "Validate",
    "Decrypt",
    "Encrypt",
    "GenerateDataKey",
    "GenerateRandom",
    "Sign",
    "Verify",
)


def _service(environ: dict) -> str:
    """The signing service of a SigV4 request (its credential scope), or ''."""
    auth = environ.get("HTTP_AUTHORIZATION", "")
    m = re.search(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/", auth)
    return m.group(1) if m else ""


def _body(environ: dict) -> bytes:
    """Read the request body (and put it back for an application further down)."""
    length = environ.get("CONTENT_LENGTH")
    if length:
        data = environ["wsgi.input"].read(int(length))
    elif environ.get("wsgi.input_terminated"):  # chunked: the server ends the stream
        data = environ["wsgi.input"].read()
    else:
        return b""
    environ["wsgi.input"] = io.BytesIO(data)
    return data


def changes_state(environ: dict, body: bytes) -> bool:
    """Whether a request to moto may change its state: by operation name (JSON and query
    protocols), else by HTTP method (S3 and the REST protocols)."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    op = target.rsplit(".", 1)[-1] if target else ""
    if not op and _service(environ) != "s3":
        form = parse_qs(environ.get("QUERY_STRING", ""))
        if not form.get("Action") and "form-urlencoded" in environ.get("CONTENT_TYPE", ""):
            form = parse_qs(body.decode(errors="replace"))
        op = (form.get("Action") or [""])[0]
    if op:
        return not op.startswith(READS)
    return environ["REQUEST_METHOD"] not in ("GET", "HEAD", "OPTIONS")


# SQS operations that change only messages (moto: Queue.add_message, Message.change_visibility);
# a delete also records the receipt handle in the queue (moto's deleted_messages)
SQS_MESSAGES_ONLY = {
    f"AmazonSQS.{op}"
    for op in (
        "SendMessage",
        "SendMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
    )
}


def changes_only(environ: dict) -> str | None:
    """persist.KEYS or persist.MESSAGES when a request changes only what that journal records
    (its snapshot then pickles no service), else None."""
    if only_keys(environ):
        return persist.KEYS
    if environ.get("HTTP_X_AMZ_TARGET") in SQS_MESSAGES_ONLY:
        return persist.MESSAGES
    return None


def only_keys(environ: dict) -> bool:
    """Whether an S3 request changes only its bucket's keys (what the key journal records): a
    plain PutObject. Tags (x-amz-tagging, or copied from a source) live in the backend's
    tagger, and multipart uploads, deletes and subresources in the bucket: those change S3."""
    return (
        _service(environ) == "s3"
        and environ["REQUEST_METHOD"] == "PUT"
        and environ.get("PATH_INFO", "").strip("/").count("/") >= 1
        and not set(parse_qs(environ.get("QUERY_STRING", ""), True)) - {"x-id"}
        and "HTTP_X_AMZ_TAGGING" not in environ
        and "HTTP_X_AMZ_COPY_SOURCE" not in environ
    )


def _json(
    start_response,
    status: int,
    doc: object,
    headers: dict | None = None,
    content_type: str = "application/x-amz-json-1.1",
) -> list[bytes]:
    body = json.dumps(doc).encode()
    reason = {
        200: "OK",
        202: "Accepted",
        400: "Bad Request",
        404: "Not Found",
        424: "Failed Dependency",
        500: "Internal Server Error",
    }.get(status, "Error")
    start_response(
        f"{status} {reason}",
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("x-amzn-RequestId", str(uuid.uuid4())),
            *(headers or {}).items(),
        ],
    )
    return [body]


class Gateway:
    """The WSGI application in front of moto's."""

    def __init__(self, stack, moto_app):
        self.stack = stack
        self.moto = moto_app

    def __call__(self, environ, start_response):
        try:
            return self.route(environ, start_response)
        except Exception as e:  # a local-stack fault answers 500 with the reason, as AWS would
            traceback.print_exc()
            return _json(start_response, 500, {"__type": "InternalFailure", "message": str(e)})

    def route(self, environ, start_response):
        path, method = environ.get("PATH_INFO", ""), environ["REQUEST_METHOD"]
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if path.startswith("/_sluice/"):
            return self.admin(path, method, environ, start_response)
        if target.startswith("SageMaker.") and self.stack.sagemaker.handles(target[10:]):
            return self.sagemaker(target[10:], _body(environ), start_response)
        m = RUNTIME.match(path)
        if m and method == "POST" and _service(environ) in ("sagemaker", ""):
            return self.invoke_endpoint(unquote(m.group(1)), environ, start_response)
        m = LAMBDA_INVOKE.match(path)
        if m and method == "POST":
            return self.invoke_function(unquote(m.group(1)), environ, start_response)
        if LAMBDA_LIST.match(path) and method == "GET":
            return _json(
                start_response,
                200,
                {"Functions": self.stack.function_configurations()},
                content_type="application/json",
            )
        if target == "AWSEvents.PutEvents":
            return self.put_events(_body(environ), start_response)
        service = _service(environ)
        if service == "sns" or target.startswith("AmazonSNS."):
            self.note_sns(environ, _body(environ))
        elif service == "s3" and path.count("/") >= 2:
            query = environ.get("QUERY_STRING", "")
            # an object written: a plain PUT, a completed multipart upload, or a DELETE
            if (
                (method == "PUT" and "uploadId" not in query)
                or method == "DELETE"
                or (method == "POST" and "uploadId=" in query)
            ):
                self.stack.say("s3", f"{method} s3:/{unquote(path)}")
        return self.to_moto(environ, start_response)

    def to_moto(self, environ, start_response):
        """moto's answer; for a change, only once the change is on disk."""
        durability = self.stack.durability
        body = _body(environ)  # read before the change holds off snapshots
        if durability is None or not changes_state(environ, body):
            return self.moto(environ, start_response)
        service = _service(environ)
        with durability.applying(changes_only(environ) or service):
            out = list(self.moto(environ, start_response))
            if service == "s3" and set(parse_qs(environ.get("QUERY_STRING", ""), True)) - S3_NEW:
                persist.objects_changed()  # tags, ACL, retention...: metadata pickled again
        durability.commit()
        return out

    # --- local answers --------------------------------------------------------------------------

    def sagemaker(self, op: str, body: bytes, start_response):
        try:
            params = json.loads(body or b"{}")
            result = self.stack.sagemaker.call(op, params)
        except ApiError as e:
            return _json(start_response, e.status, {"__type": e.code, "message": e.message})
        if op.startswith(("Create", "Update", "Stop", "Delete")):
            name = next((v for k, v in params.items() if k.endswith(("Name", "Arn"))), "")
            self.stack.say("sagemaker", f"{op} {name}")
        return _json(start_response, 200, result)

    def invoke_endpoint(self, name: str, environ, start_response):
        body = _body(environ)
        headers = {
            k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")
        }
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        try:
            status, reply, out = self.stack.endpoints.invoke(name, body, headers)
        except ApiError as e:
            return _json(
                start_response,
                e.status,
                {"message": e.message},
                {"x-amzn-ErrorType": e.code},
                "application/json",
            )
        start_response(
            f"{status} OK",
            [
                *reply.items(),
                ("Content-Length", str(len(out))),
                ("x-amzn-RequestId", str(uuid.uuid4())),
            ],
        )
        return [out]

    def invoke_function(self, name: str, environ, start_response):
        body = _body(environ)
        kind = environ.get("HTTP_X_AMZ_INVOCATION_TYPE", "RequestResponse")
        functions = self.stack.functions
        try:
            functions.spec(name)
        except KeyError as e:
            return _json(
                start_response,
                404,
                {"Type": "User", "message": str(e)},
                {"x-amzn-ErrorType": "ResourceNotFoundException"},
                "application/json",
            )
        payload = json.loads(body) if body.strip() else {}
        if kind == "Event":
            functions.invoke_async(name, payload, source="Invoke (Event)")
            start_response("202 Accepted", [("Content-Length", "0")])
            return [b""]
        if kind == "DryRun":
            start_response("204 No Content", [("Content-Length", "0")])
            return [b""]
        result = functions.invoke(name, payload, source="Invoke")
        headers = {"X-Amz-Executed-Version": "$LATEST"}
        if result.error is not None:
            headers["X-Amz-Function-Error"] = "Unhandled"
            return _json(start_response, 200, result.error, headers, "application/json")
        return _json(start_response, 200, result.payload, headers, "application/json")

    def put_events(self, body: bytes, start_response):
        entries = json.loads(body).get("Entries", [])
        out = []
        for e in entries:
            evt = event(
                e["Source"],
                e["DetailType"],
                json.loads(e.get("Detail") or "{}"),
                e.get("Resources"),
            )
            self.stack.bus.put(evt)
            out.append({"EventId": evt["id"]})
        return _json(start_response, 200, {"FailedEntryCount": 0, "Entries": out})

    def note_sns(self, environ, body: bytes) -> None:
        if environ.get("HTTP_X_AMZ_TARGET", "").endswith(".Publish"):
            form = {k: [v] for k, v in json.loads(body or b"{}").items()}
        else:
            form = parse_qs(body.decode(errors="replace"))
        if form.get("Action", ["Publish"])[0] != "Publish" or "Message" not in form:
            return
        topic = form.get("TopicArn", [""])[0].rsplit(":", 1)[-1]
        subject = form.get("Subject", [""])[0]
        message = form["Message"][0]
        self.stack.notify(topic, subject, message)

    def admin(self, path: str, method: str, environ, start_response):
        if path == "/_sluice/status":
            return _json(start_response, 200, self.stack.status(), content_type="application/json")
        if path == "/_sluice/notifications":
            return _json(
                start_response, 200, self.stack.notifications(), content_type="application/json"
            )
        if path == "/_sluice/dashboard":
            query = parse_qs(environ.get("QUERY_STRING", ""))
            page = self.stack.dashboard_html(float(query.get("hours", ["3"])[0])).encode()
            start_response(
                "200 OK",
                [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(page)))],
            )
            return [page]
        m = re.match(r"^/_sluice/schedules/([^/]+)$", path)
        if m and method == "POST":
            try:
                fired = self.stack.scheduler.fire(unquote(m.group(1)))
            except Exception as e:
                return _json(
                    start_response, 404, {"message": str(e)}, content_type="application/json"
                )
            return _json(start_response, 200, fired, content_type="application/json")
        return _json(
            start_response, 404, {"message": f"no {method} {path}"}, content_type="application/json"
        )

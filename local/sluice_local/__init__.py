"""Local Sluice: the whole application from template.yaml on one machine, no AWS account needed.

moto (in server mode) provides the AWS APIs it emulates faithfully; a local SageMaker runs the
container's own commands as processes; the Lambda handlers run in-process, invoked as Lambda
would; events, queues and schedules reach them as they would on AWS. See `sluice-local --help`.
"""

__version__ = "0.1.0"

ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"

"""The local SageMaker: control plane (api, shapes), jobs, endpoints."""

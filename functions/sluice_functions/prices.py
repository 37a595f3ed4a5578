"""What a Batch Transform job cost: instance-seconds times an hourly price.

The table holds SageMaker's on-demand list prices for Batch Transform in us-east-1 (USD per
instance-hour, Linux) for the instance types Sluice's docs suggest, as published when this file
was written (December 2026). Prices differ by region and change: the template parameter
`TransformPricePerHour` overrides the table (set it to your region's price, or your Savings Plan
rate); a type the table does not know gets no cost, and the report says why.
"""

from __future__ import annotations

TRANSFORM_USD_PER_HOUR = {
    "ml.g4dn.xlarge": 0.736,
    "ml.g4dn.2xlarge": 0.94,
    "ml.g5.xlarge": 1.408,
    "ml.g5.2xlarge": 1.515,
    "ml.g5.4xlarge": 2.03,
    "ml.p3.2xlarge": 3.825,
    "ml.m5.large": 0.115,
    "ml.m5.xlarge": 0.23,
    "ml.c5.xlarge": 0.204,
}
SOURCE = "us-east-1 on-demand list price (functions/sluice_functions/prices.py)"


def job_cost(instance_type: str | None, instance_seconds: float | None, override: str = "") -> dict:
    """{"usd", "usd_per_hour", "price"}: the job's cost, or usd None with the reason."""
    try:
        given = float(override) if override.strip() else None
    except ValueError:  # the template's AllowedPattern keeps this out; a hand-set variable may not
        given = None
    if given is not None:
        per_hour, source = given, "TransformPricePerHour"
    elif instance_type in TRANSFORM_USD_PER_HOUR:
        per_hour, source = TRANSFORM_USD_PER_HOUR[instance_type], SOURCE
    else:
        return {
            "usd": None,
            "usd_per_hour": None,
            "price": f"{instance_type} is not in the price table: set TransformPricePerHour",
        }
    usd = None if instance_seconds is None else round(instance_seconds / 3600 * per_hour, 6)
    return {"usd": usd, "usd_per_hour": per_hour, "price": source}

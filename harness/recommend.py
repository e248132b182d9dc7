"""Old import path of the advisor's Python entry points (now harness.advisor.recommend), kept for user code."""

from harness.advisor.recommend import recommend, recommend_many, recommend_workload  # noqa: F401
from harness.advisor.workload import Workload, load_workloads  # noqa: F401

__all__ = ["Workload", "load_workloads", "recommend", "recommend_many", "recommend_workload"]

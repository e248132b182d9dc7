"""The advisor from Python (the public face of harness.advisor): recommend a backend for a workload."""

from harness.advisor.ranking import Recommendation
from harness.advisor.recommend import recommend, recommend_many, recommend_workload
from harness.advisor.workload import Workload, load_workloads

__all__ = ["Recommendation", "Workload", "load_workloads", "recommend", "recommend_many", "recommend_workload"]

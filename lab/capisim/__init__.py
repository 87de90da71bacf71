"""capisim: a small Kubernetes API server for the Cluster API and Metal3 kinds.

It stands in for a management cluster in the lab and in tests, since no
kube-apiserver can be installed on these machines. See docs/simulator.md.
"""

from .server import Identity, Simulator  # noqa: F401
from .store import ApiError, Store  # noqa: F401

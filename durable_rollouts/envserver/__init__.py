"""Environment side: declare an environment and serve it over the control channel.

Must not import ``durable_rollouts.sdk`` (the user side builds on this, not the other way).
"""

from __future__ import annotations

from .environment import Answer, Capability, Environment, Template, normalize_grade
from .loader import load_environment
from .runner import TaskRunner
from .server import EnvServer, serve, serving
from .sessions import SessionState

__all__ = [
    "Answer",
    "Capability",
    "EnvServer",
    "Environment",
    "SessionState",
    "TaskRunner",
    "Template",
    "load_environment",
    "normalize_grade",
    "serve",
    "serving",
]

"""The control-channel client: ``connect(url)`` -> :class:`EnvClient`, sessions kept across steps.

``envclient`` speaks the wire protocol (framed by the shared sans-I/O ``protocol`` module),
``capabilities`` opens an environment's capabilities (ssh workspace, mcp tools, raw tcp),
``channel`` is a rollout step's view of a session (open, resume, start, grade, end), ``kept``
the connections a step leaves for the next step in this process, ``tokens`` the substrate
tokens derived from a key. Sits beside ``envserver``: imports the shared models only.
"""

from .envclient import EnvClient, connect
from .manifest import Manifest

__all__ = ["EnvClient", "Manifest", "connect"]

"""Hidden test of the coding example: run by the grader OUTSIDE the sandbox.

The sandbox never sees this directory. It imports ``mathutils`` from the workspace
(the grader puts the workspace on PYTHONPATH) and exits non-zero on any failure.
"""

import mathutils

assert mathutils.clamp(5, 0, 3) == 3, "clamp above the range"
assert mathutils.clamp(-1, 0, 3) == 0, "clamp below the range"
assert mathutils.clamp(2, 0, 3) == 2, "clamp inside the range"
assert mathutils.mean([1, 2, 3]) == 2, "mean"
print("all hidden tests passed")

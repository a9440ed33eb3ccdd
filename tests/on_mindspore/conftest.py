"""The MindSpore system tests: ms_job and ms_cases are imported from this directory."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

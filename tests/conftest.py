"""Each framework's tests run in that framework's environment: `make test` runs tests/on_mindspore in the isolated
MindSpore environment it creates (MindSpore pins numpy<2) and everything else in the torch one. tests/shared holds
the cases both run (through tests/st and tests/on_mindspore), no test module: neither collects it."""

import importlib.util

collect_ignore = ["shared"]
if importlib.util.find_spec("mindspore") is None:
    collect_ignore.append("on_mindspore")
if importlib.util.find_spec("torch") is None:
    collect_ignore += ["st", "unit"]

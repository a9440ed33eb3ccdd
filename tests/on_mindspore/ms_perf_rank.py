"""One rank of ``python -m hyper_parallel.perf.mindspore`` under msrun, which starts a script file: this one runs the
installed module as ``__main__`` with this script's arguments (the module's own file cannot be the script: its
name, mindspore.py, would shadow the mindspore package on sys.path)."""

import runpy

runpy.run_module("hyper_parallel.perf.mindspore", run_name="__main__", alter_sys=True)

# The two commands of the quick start:  `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3
NPROC_DEMO ?= 4
BUILD_CPP := build/cpp
BUILD_SAN := build/cpp-sanitize
# bash, for pipefail in `install`'s filtered build log.
SHELL := /bin/bash

.PHONY: deps test-deps install demo perf perf-multinode perf-one-sided-multinode perf-mindspore perf-mindspore-multinode \
	test test-cpp test-cpp-sanitize test-py \
	test-mindspore mindspore-env torch214-env test-torch214 clean

# What building and installing the package needs, and no more (`make demo` installs only these): torch and numpy (its
# run-time dependencies: the package installs with --no-deps), scikit-build-core and ninja, and cmake with a C++
# compiler from Debian where the machine has none. TORCH is the suite's torch, 2.13.0's
# CPU wheel; any torch >= 2.13 builds the package, CPU or CUDA wheel, without a CUDA toolkit (`make demo TORCH=torch`
# keeps the one installed).
TORCH ?= torch==2.13.0
BUILD_DEPS := "$(TORCH)" numpy "scikit-build-core>=0.10" ninja
deps:
	@echo "== Installing the build requirements: $(TORCH), numpy, scikit-build-core, ninja"
	$(PYTHON) -m pip install --quiet $(BUILD_DEPS)
	@if ! command -v cmake >/dev/null || ! command -v c++ >/dev/null; then \
	  echo "== Installing cmake and g++ from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++; \
	fi

# What the tests add: pytest and hypothesis, mypy (the typing test), numpy (the tests' references), matplotlib (the
# perf tool's plot), mpi4py and MPICH (its MPI baseline), googletest from Debian (the C++ units), and ccache from
# Debian (the three wheels' builds below share the runtime's objects through it), and UCX's wheel (the package then
# builds with one-sided calls across nodes, which test_multinode.py checks).
UCX_DEP := "libucx-cu12>=1.22"
TEST_DEPS := "pytest>=8" hypothesis mypy numpy matplotlib mpi4py mpich $(UCX_DEP)
test-deps: deps
	$(PYTHON) -m pip install --quiet $(TEST_DEPS)
	@if [ ! -f /usr/include/gtest/gtest.h ] || ! command -v ccache >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev cmake ccache; \
	fi

# The wheels `make test` builds (install, mindspore-env, torch214-env) compile the same runtime with the same flags,
# each in a build directory of its own: where ccache is installed, the first compiles it and the others take its
# objects (the torch binding is compiled against each torch, the cache keys on its headers). CCACHE_BASEDIR makes the
# build directories' paths relative so that their commands match.
CCACHE_ENV := CCACHE_DIR=$(CURDIR)/build/ccache CCACHE_BASEDIR=$(CURDIR)
CCACHE_LAUNCHER := $$(command -v ccache >/dev/null && echo --config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)

# Builds and installs the package into $(1)'s environment, showing the build's own lines as it goes
# (scikit-build-core's steps, ninja's [n/N] progress); everything else goes to the log $(3), whose end is shown when
# the build fails. $(2): pip's extra arguments.
define build_package
	@mkdir -p build
	@echo "== Building hyper-parallel-shmem (the C++ runtime and the torch binding against torch" \
	  "$$($(1) -c 'import torch; print(torch.__version__)'), a few minutes on 2 cores; full log: $(3))"
	@set -o pipefail; $(CCACHE_ENV) $(1) -m pip install -v --no-build-isolation --no-deps $(CCACHE_LAUNCHER) $(2) . 2>&1 \
	  | tee $(3) \
	  | { grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\] |^ *\*\*\* |^Successfully installed' || true; } \
	  || { echo "== The build failed; the end of $(3):"; tail -n 40 $(3); exit 1; }
endef

install: deps
	$(call build_package,$(PYTHON),,build/install.log)

demo: install
	cd examples && HYPER_PARALLEL_SHMEM_HEAP_SIZE=64M $(PYTHON) -m torch.distributed.run --standalone --nproc-per-node $(NPROC_DEMO) ring_demo.py

# The README's performance table and plot: every op, 8 B to 64 MiB, ours on ordinary tensors beside gloo and MPICH
# (docs/perf.md).
perf: install test-deps
	mpiexec -n 2 $(PYTHON) -m hyper_parallel.perf --op all --baseline gloo,mpi -b 8 -e 64M -f 2 --ordinary-tensors \
	  --json perf.json --plot docs/perf.png

# The README's rows across nodes: 2 simulated nodes x 2 ranks of this machine (tests/st/simulated_nodes.py: needs root
# or CAP_SYS_ADMIN for the namespaces), ours beside gloo (docs/multinode.md); UCX over TCP on loopback, where the
# package has UCX (the simulated nodes share one kernel: UCX's shared-memory transports would find no peer).
perf-multinode: install
	UCX_TLS=tcp,self $(PYTHON) tests/st/simulated_nodes.py --nodes 2 --nproc-per-node 2 --timeout 1500 -- -m hyper_parallel.perf --op all \
	  --baseline gloo -b 8 -e 16M -f 4 -r 5 --ordinary-tensors --json perf-multinode.json

# The one-sided ops across nodes (docs/multinode.md): put, get, put_with_signal and signal_pingpong from rank 0 to the
# lowest rank of the other node, beside UCX's own put/get (the floor), gloo and MPICH's one-sided RMA, on 2 simulated
# nodes x PERF_PER_NODE ranks (1 or 2) under mpiexec (tests/st/simulated_mpi.py), UCX over TCP.
PERF_PER_NODE ?= 2
perf-one-sided-multinode: install test-deps
	UCX_TLS=tcp,self $(PYTHON) tests/st/simulated_mpi.py --nodes 2 --nproc-per-node $(PERF_PER_NODE) --timeout 1500 -- \
	  $(PYTHON) -m hyper_parallel.perf --op put,get,put_with_signal,signal_pingpong --peer across --baseline gloo,mpi \
	  -b 8 -e 16M -f 8 -n 200 -w 20 -r 7 --progress off --json perf-one-sided-multinode.json

# test-deps first: its ccache then serves the first wheel's build too.
test: test-deps install test-cpp test-cpp-sanitize test-py test-mindspore test-torch214

test-cpp: test-deps
	cmake -S . -B $(BUILD_CPP) -DHP_BUILD_TORCH_BINDING=OFF -DHP_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD_CPP) --parallel 2
	ctest --test-dir $(BUILD_CPP) --output-on-failure

# The ascend device's 16-rank cases and its 10,000-sync wrap run in the plain build only: under the sanitizers they
# take over half of the run's time on 2 cores; the same paths run there at 2, 3, 4 and 8 ranks, and the host wrap test.
SANITIZE_SKIP := AscendCollectivesTest\..*/16$$|AscendSignalWrapTest\.
test-cpp-sanitize: test-deps
	cmake -S . -B $(BUILD_SAN) -DHP_BUILD_TORCH_BINDING=OFF -DHP_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Debug -DHP_SANITIZE=address,undefined
	cmake --build $(BUILD_SAN) --parallel 2
	ctest --test-dir $(BUILD_SAN) --output-on-failure -E '$(SANITIZE_SKIP)'

# Run from tests/ against the installed package, never the source tree's src/. The slowest tests are listed at the end:
# where the suite's time goes.
test-py: install test-deps
	$(PYTHON) -m pytest tests -q --durations=25

# MindSpore's handler runs in an environment of its own: MindSpore pins numpy<2, and its wheel brings no torch. The
# package is built there without the torch binding (the C ABI library libhp_shmem_c.so is in every build). UCX's wheel
# is installed before the build, as test-deps does for torch's: the build then links UCX, and MindSpore's ranks reach
# the ranks of other nodes (tests/on_mindspore/test_ms_multinode.py).
MS_VENV := build/venv-mindspore
MS_PYTHON := $(MS_VENV)/bin/python
mindspore-env: deps
	@test -x $(MS_PYTHON) || $(PYTHON) -m venv $(MS_VENV)
	$(MS_PYTHON) -m pip install --quiet "mindspore==2.10.0" "numpy<2" "pytest>=8" hypothesis "scikit-build-core>=0.10" ninja \
	  $(UCX_DEP)
	$(CCACHE_ENV) $(MS_PYTHON) -m pip install --quiet --no-build-isolation --no-deps $(CCACHE_LAUNCHER) \
	  --config-settings=build-dir=build/wheel-mindspore --config-settings=cmake.define.HP_BUILD_TORCH_BINDING=OFF .

test-mindspore: mindspore-env
	$(MS_PYTHON) -m pytest tests/on_mindspore -q

# torch 2.14 in an environment of its own (build/venv-torch214): torch 2.14.1's default Linux wheel, the CUDA build
# (on these machines it lies on disk), the test tools, and the package built there against it; then the torch suite
# again, as test-py runs it on 2.13, but for the modules marked `one_torch` (tests/st/conftest.py: the runtime's
# behaviour between processes, which no torch release changes; the README's Install says how long this step takes).
TORCH214_VENV := build/venv-torch214
TORCH214_PYTHON := $(TORCH214_VENV)/bin/python
torch214-env:
	@test -x $(TORCH214_PYTHON) || $(PYTHON) -m venv $(TORCH214_VENV)
	@echo "== Installing torch 2.14.1 (the CUDA wheel) and the build and test tools into $(TORCH214_VENV)"
	$(TORCH214_PYTHON) -m pip install --quiet "torch==2.14.1" "scikit-build-core>=0.10" ninja $(TEST_DEPS)
	$(call build_package,$(TORCH214_PYTHON),--config-settings=build-dir=build/wheel-torch214,build/install-torch214.log)

test-torch214: torch214-env
	$(TORCH214_PYTHON) -m pytest tests -q -m "not one_torch"

# The README's MindSpore rows: ours on MindSpore tensors beside mccl (mindspore.mint.distributed), 2 ranks under msrun
# (docs/perf.md, "MindSpore"). msrun starts `python` from PATH: the MindSpore environment's; rank 0's table is in
# build/perf-mindspore-logs/worker_0.log as well.
PERF_MS_ARGS ?= --op all -b 8 -e 16M -f 4 -n 100 -w 10 -r 5
perf-mindspore: mindspore-env
	PATH="$(abspath $(MS_VENV))/bin:$$PATH" GLOG_v=3 $(MS_PYTHON) -m mindspore.parallel.cluster.run --worker_num=2 \
	  --local_worker_num=2 --master_port=$$($(MS_PYTHON) -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') \
	  --log_dir=build/perf-mindspore-logs --join=True python -m hyper_parallel.perf.mindspore $(PERF_MS_ARGS) \
	  --json perf-mindspore.json

# MindSpore across simulated nodes (docs/mindspore.md): 2 nodes x 2 ranks under msrun, ours (the phases across nodes
# over UCX) beside mccl, whose reduce_scatter and all_to_all have no CPU kernel.
perf-mindspore-multinode: mindspore-env
	UCX_TLS=tcp,self GLOG_v=3 $(MS_PYTHON) tests/st/simulated_nodes.py --nodes 2 --nproc-per-node 2 --launcher msrun \
	  --timeout 1500 -- python -m hyper_parallel.perf.mindspore --op all -b 8 -e 8M -f 8 -r 5 \
	  --json perf-mindspore-multinode.json

clean:
	rm -rf build

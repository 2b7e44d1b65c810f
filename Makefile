# Build, test and demo targets; see README.md.
GO ?= go
BIN := bin

.PHONY: build test demo bench bigsnap fuzz lint clean pgo

# The commit and the build date go into --version (cmd/internal/cli) even
# where the go command stamps no VCS information.
COMMIT := $(shell git describe --always --dirty --abbrev=12 2>/dev/null)
LDFLAGS := -X github.com/gpualloc/allocsim/cmd/internal/cli.commit=$(COMMIT) -X github.com/gpualloc/allocsim/cmd/internal/cli.buildDate=$(shell date -u +%Y-%m-%dT%H:%M:%SZ)

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/record ./cmd/record
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/replay ./cmd/replay
	$(CC) -O2 -shared -fPIC -o $(BIN)/librecord-interpose.so gpu/interpose/preload/interpose.c -ldl -lpthread

# test runs every test; the real-trace tests use ../shared/traces when it
# exists and the small real traces under testdata/ always.
test:
	$(GO) vet ./...
	$(GO) test -count=1 ./...
	cd examples/segfit && $(GO) vet ./... && $(GO) test -count=1 ./...

# demo replays a real PyTorch training trace (testdata/pytorch/train_gpt)
# against every policy, prints the table and writes JSON and charts.
demo: build
	$(BIN)/replay sim --policy all --json out/demo.json --plots out/demo testdata/pytorch/train_gpt.pickle.gz
	@echo "wrote out/demo.json and the charts in out/demo/"

# bench runs the benchmarks of import, decode and every policy's replay on
# kv_decode (from ../shared/traces, or $$ALLOCSIM_TRACES) and on a synthetic
# 10M-event trace, and the bytes held per live allocation with 10M live at
# once (pytorch, best-fit, check), then prints one BENCH line per
# measurement. BenchmarkManyStreams and BenchmarkManyPools (sim) replay a
# malloc and free on each of 100000 streams and of 20000 private pools
# against every policy (trace=streams100000, pools20000). With DYNAPIPE set to a checkout of
# github.com/awslabs/optimizing-multitask-training-through-dynamic-pipelines
# (and Python's sortedcontainers), it also times DynaPipe's Python port of
# PyTorch's caching allocator on kv_decode's mallocs and frees beside our
# replay of them (sim/testdata/dynapipe/loop.py): the loop-against-loop
# ratio, the median of 5 rounds of a pass of theirs and then ours, for our
# policy's calls alone (ratio), through the handles the replay uses
# (handle_ratio: the most the whole replay could reach), the same with the
# replay's live table by address (live_loop_ns_per_op) and the whole
# replay (replay_ratio). BenchmarkTune (sim/tune) times replay tune's 180 candidates on
# kv_decode on one core: each replayed, and as tune runs by default.
# BenchmarkImportBig imports a large synthetic snapshot shaped as PyTorch
# writes one recorded with stacks ($$ALLOCSIM_BIG_SNAPSHOT, or the ~1 GiB one
# `make bigsnap` writes to $$TMPDIR/allocsim-big-snapshot.pickle; skipped
# without either), and in processes of their own, side by side, the same
# import and CPython's pickle.load of it: the median of 5 rounds
# ($$ALLOCSIM_IMPORT_ROUNDS) of their wall and CPU time and peak RSS, and
# the ratios (stage=import-vs-cpython); BenchmarkImport does the same on
# kv_decode, of the gzip file (both gunzip it) and of its pickle.
# BenchmarkExec (policies/execpolicy) times events through the exec protocol
# with a Go and a Python child that answer at once (malloc and free by
# turns, frees only) beside a plain round trip over the same pipes
# (pattern=pipe), each for a second, since an op there is one event, not a
# whole trace.
# The benchmarks of sim and sim/tune are compiled with the replay
# command's profile (PGO, below), as `make build` compiles the command.
bench:
	$(GO) test -pgo=$(CURDIR)/$(PGO) ./sim ./sim/tune -run '^$$' -bench . -benchtime 2x -timeout 60m
	$(GO) test ./policies/execpolicy -run '^$$' -bench Exec -benchtime 1s

# pgo writes cmd/replay/default.pgo, the CPU profile that `go build` optimizes the replay
# command with (Go's profile-guided optimization: hot calls inlined and
# interface calls devirtualized), from the main job on real snapshots: the
# profiles (ALLOCSIM_CPUPROFILE) of `replay sim --policy all` on kv_decode
# and on the embedded train_gpt and of `replay fit --policy all` on
# hf_llama_train (under ../shared/traces, or $$ALLOCSIM_TRACES), merged.
# Run it again after a change to the replay's or a policy's hot paths.
PGO := cmd/replay/default.pgo
PGO_TRACES = $(or $(ALLOCSIM_TRACES),../shared/traces)
pgo: build
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	ALLOCSIM_CPUPROFILE=$$tmp/sim.prof $(BIN)/replay sim --policy all $(PGO_TRACES)/pytorch/kv_decode.pickle.gz >/dev/null; \
	ALLOCSIM_CPUPROFILE=$$tmp/demo.prof $(BIN)/replay sim --policy all testdata/pytorch/train_gpt.pickle.gz >/dev/null; \
	ALLOCSIM_CPUPROFILE=$$tmp/fit.prof $(BIN)/replay fit --policy all $(PGO_TRACES)/pytorch/hf_llama_train.pickle.gz >/dev/null; \
	$(GO) tool pprof -proto $$tmp/sim.prof $$tmp/demo.prof $$tmp/fit.prof > $$tmp/default.pgo; \
	mv $$tmp/default.pgo $(PGO)
	@echo "wrote $(PGO)"

# lint runs staticcheck (honnef.co/go/tools, installed by .ci/run) on
# every package, the example policy module's too.
STATICCHECK ?= staticcheck
lint:
	$(STATICCHECK) ./...
	cd examples/segfit && $(STATICCHECK) ./...

# bigsnap writes the big snapshot of BenchmarkImportBig (a minute, ~5 GB of
# memory for python3; BIGSNAP_MB sets its size in MiB).
BIGSNAP_MB ?= 1024
bigsnap:
	python3 trace/pytorch/testdata/bigsnap.py --mb $(BIGSNAP_MB)

# fuzz runs each fuzz target for FUZZTIME (the seed corpora and the
# crashers kept under testdata/fuzz run in every `make test`).
FUZZTIME ?= 10m
fuzz:
	$(GO) test ./trace -run '^$$' -fuzz '^FuzzReader$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./trace -run '^$$' -fuzz '^FuzzText$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./trace/pytorch -run '^$$' -fuzz '^FuzzImport$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./trace/rmm -run '^$$' -fuzz '^FuzzImport$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./trace/minimalloc -run '^$$' -fuzz '^FuzzRead$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./trace/cupy -run '^$$' -fuzz '^FuzzCuPy$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./trace/kineto -run '^$$' -fuzz '^FuzzKineto$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./trace/xspace -run '^$$' -fuzz '^FuzzXSpace$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./sim -run '^$$' -fuzz '^FuzzCostModel$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./sim/results -run '^$$' -fuzz '^FuzzReader$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./sim/sweep -run '^$$' -fuzz '^FuzzReadCell$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s
	$(GO) test ./policies -run '^$$' -fuzz '^FuzzPytorchConf$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s

clean:
	rm -rf $(BIN) out

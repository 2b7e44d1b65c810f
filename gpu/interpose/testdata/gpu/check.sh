#!/usr/bin/env bash
# check.sh runs the interposer's GPU-machine checks from the repository
# root, with bin/record built for this machine (CGO_ENABLED=0) and results
# written under $OUT: allocs.cu linked statically (nvcc's default) and with
# -cudart shared, and torch_prog.py, each run without and with
# `record run`, twice, for the overhead; the traces and outputs to compare.
set -x
D=gpu/interpose/testdata/gpu
W=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/gpu.txt
nvcc --version | tail -2 >> $OUT/gpu.txt
ldd --version | head -1 >> $OUT/gpu.txt
cc -O2 -shared -fPIC -o bin/librecord-interpose.so gpu/interpose/preload/interpose.c -ldl -lpthread
nvcc -O2 -o $W/allocs_static $D/allocs.cu -lpthread
nvcc -O2 -cudart shared -o $W/allocs_shared $D/allocs.cu -lpthread
for v in static shared; do
	for r in 1 2; do
		$W/allocs_$v > $OUT/$v.plain$r.txt 2>&1
		bin/record run -o $OUT/$v.trace -- $W/allocs_$v > $OUT/$v.rec$r.txt 2>&1
		echo "exit $?" >> $OUT/$v.rec$r.txt
	done
done
for r in 1 2; do
	python3 $D/torch_prog.py $W/plain$r > $OUT/torch.plain$r.txt 2>&1
	cp $W/plain$r.json $OUT/torch.plain$r.json
	bin/record run -o $OUT/torch.trace -- python3 $D/torch_prog.py $OUT/torch$r > $OUT/torch.rec$r.txt 2>&1
	echo "exit $?" >> $OUT/torch.rec$r.txt
done
# The virtual memory API (testdata/h200 holds these two recordings): PyTorch
# with expandable segments, and JAX with the platform allocator beside the
# same job under XLA's BFC allocator (its num_allocs).
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True bin/record run -o $OUT/torch_expandable.trace -- python3 $D/torch_prog.py $OUT/torch_expandable > $OUT/torch_expandable.txt 2>&1
XLA_PYTHON_CLIENT_ALLOCATOR=platform bin/record run -o $OUT/jax_platform.trace -- python3 $D/jax_prog.py $OUT/jax_platform.json > $OUT/jax_platform.txt 2>&1
python3 $D/jax_prog.py $OUT/jax_default.json > $OUT/jax_default.txt 2>&1
ls -la $OUT

# torch_graph.py: a CUDA graph captured with torch.cuda.graph after a
# warm-up on a side stream, replayed once and dropped; recorded by `record
# run` under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync as
# testdata/h200/torch_graph_async.trace (see h200_test.go).
import torch
x = torch.randn(256, 256, device="cuda")
w = torch.randn(256, 256, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(2):
        y = x @ w
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x @ w
    z = y.relu()
g.replay()
torch.cuda.synchronize()
del g
torch.cuda.synchronize()
print("ok", torch.__version__)

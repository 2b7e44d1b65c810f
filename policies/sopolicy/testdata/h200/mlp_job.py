# Runs a small deterministic training job under the test's pluggable
# allocator (policies/sopolicy/testdata/caching.c built against the real
# CUDA runtime), logging every request it gets and its own cudaMalloc and
# cudaFree counts and peak.
import ctypes, json, os, sys
out, lib = sys.argv[1], sys.argv[2]
os.environ["CACHING_LOG"] = os.path.join(out, "requests.txt")
import torch
alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "my_malloc", "my_free")
torch.cuda.memory.change_current_allocator(alloc)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.Adam(model.parameters())
for step in range(5):
    x = torch.randn(256 * (step + 1), 1024, device="cuda")
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del x, loss
torch.cuda.synchronize()
c = ctypes.CDLL(lib)
a = (ctypes.c_longlong * 5)()
c.caching_stats(a)
json.dump({"cudaMalloc": a[0], "cudaFree": a[1], "refused": a[2], "reserved_end": a[3], "peak_reserved": a[4],
           "torch": torch.__version__}, open(os.path.join(out, "so_stats.json"), "w"), indent=1)
print("stats", list(a))

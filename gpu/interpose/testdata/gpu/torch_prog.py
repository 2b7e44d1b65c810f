# torch_prog.py is the PyTorch script that the GPU-machine check records
# with `record run` (check.sh): a small training loop with varying batch
# sizes, an empty_cache, large tensors, pinned memory; it writes its own
# snapshot (PREFIX.pickle) and memory_stats (PREFIX.json) to compare with
# the recorded trace.
import json
import sys
import time

import torch

prefix = sys.argv[1]
t0 = time.time()
torch.cuda.memory._record_memory_history(max_entries=1_000_000)
dev = "cuda"
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.Adam(model.parameters())
for it in range(30):
    x = torch.randn(64 * (1 + it % 8), 1024, device=dev)
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if it == 10:
        torch.cuda.empty_cache()
big = [torch.empty(n << 20, dtype=torch.uint8, device=dev) for n in (3, 30, 300, 1000)]
del big
torch.cuda.empty_cache()
pinned = torch.empty(1 << 20, pin_memory=True)
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
seconds = time.time() - t0
torch.cuda.memory._dump_snapshot(prefix + ".pickle")
out = {k: stats[k] for k in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms")}
out.update(seconds=seconds, torch=torch.__version__, cuda=torch.version.cuda)
with open(prefix + ".json", "w") as f:
    json.dump(out, f)
print(json.dumps(out))

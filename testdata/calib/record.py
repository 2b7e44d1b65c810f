"""Four PyTorch jobs recorded for the latency table of issue 37 (the
simulated allocator time against the time measured by replay gpu), each
in a process of its own, recorded as the README tells users to
(torch.cuda.memory._record_memory_history() with PyTorch's defaults,
_dump_snapshot at the end):

    python3 testdata/calib/record.py OUTDIR [NAME...]

  ckpt_accum     a 12-layer MLP-and-attention stack trained with activation
                 checkpointing and gradient accumulation (4 micro-batches
                 of varying length), 6 steps
  four_streams   four CUDA streams, each running its own chain of matmuls
                 on tensors allocated on it, joined by events
  inductor_dyn   a torch.compile(dynamic=True) MLP run on 24 batch sizes
  pinned_stream  pinned host buffers copied to the device on a side stream
                 (non_blocking), consumed on the default stream

It writes OUTDIR/NAME.pickle.gz and OUTDIR/NAME.stats.json (the real
allocator's max_memory_reserved and memory_stats()).
"""
import gzip
import json
import os
import subprocess
import sys
import time


def ckpt_accum(torch):
    from torch.utils.checkpoint import checkpoint
    d = 1024

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.up = torch.nn.Linear(d, 4 * d)
            self.down = torch.nn.Linear(4 * d, d)

        def forward(self, x):
            q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 16, d // 16).unbind(2)
            a = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            x = x + a.transpose(1, 2).reshape(x.shape)
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    layers = torch.nn.ModuleList([Block() for _ in range(12)]).cuda()
    opt = torch.optim.AdamW(layers.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        for _ in range(4):
            seq = int(torch.randint(128, 1024, (1,), generator=g))
            x = torch.randn(8, seq, d, device="cuda", requires_grad=True)
            for layer in layers:
                x = checkpoint(layer, x, use_reentrant=False)
            x.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def four_streams(torch):
    streams = [torch.cuda.Stream() for _ in range(4)]
    outs = []
    for step in range(30):
        done = []
        for k, s in enumerate(streams):
            with torch.cuda.stream(s):
                n = 512 + 256 * ((step + k) % 5)
                a = torch.randn(n, n, device="cuda")
                for _ in range(4):
                    a = torch.tanh(a @ a) * 0.1
                ev = torch.cuda.Event()
                ev.record(s)
                done.append((a, ev, s))
        for a, ev, s in done:
            torch.cuda.current_stream().wait_event(ev)
            a.record_stream(torch.cuda.current_stream())
            outs.append(a.sum())
        del done
    torch.stack(outs).sum().item()


def inductor_dyn(torch):
    m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    f = torch.compile(m, dynamic=True)
    with torch.no_grad():
        for b in range(8, 8 + 24 * 40, 40):
            y = f(torch.randn(b, 1024, device="cuda"))
            y.sum().item()


def pinned_stream(torch):
    side = torch.cuda.Stream()
    host = [torch.randn(4 << 20 if k % 2 else 1 << 20, pin_memory=True) for k in range(8)]
    acc = torch.zeros(1, device="cuda")
    for step in range(40):
        h = host[step % len(host)]
        with torch.cuda.stream(side):
            d = h.to("cuda", non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(side)
        torch.cuda.current_stream().wait_event(ev)
        d.record_stream(torch.cuda.current_stream())
        w = torch.randn(d.numel() // 1024, 1024, device="cuda")
        acc += (d.view(-1, 1024) * w).sum()
        del d, w
    acc.item()


WORKLOADS = {"ckpt_accum": ckpt_accum, "four_streams": four_streams, "inductor_dyn": inductor_dyn, "pinned_stream": pinned_stream}


def child(name, outdir):
    import torch
    torch.cuda.init()
    torch.cuda.memory._record_memory_history()  # PyTorch's defaults, as users record
    t0 = time.time()
    WORKLOADS[name](torch)
    torch.cuda.synchronize()
    wall = time.time() - t0
    path = os.path.join(outdir, name)
    torch.cuda.memory._dump_snapshot(path + ".pickle")
    with open(path + ".pickle", "rb") as fin, gzip.open(path + ".pickle.gz", "wb") as fout:
        fout.write(fin.read())
    os.remove(path + ".pickle")
    stats = {
        "workload": name, "label": name, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
        "wall_s": wall, "mem_cap_bytes": 0, "oom": "",
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "memory_reserved_end": torch.cuda.memory_reserved(),
        "memory_allocated_end": torch.cuda.memory_allocated(),
        "memory_stats": dict(torch.cuda.memory_stats()),
    }
    with open(path + ".stats.json", "w") as f:
        json.dump(stats, f, indent=1)
    print(name, {k: stats[k] for k in ("max_memory_reserved", "max_memory_allocated", "wall_s")}, flush=True)


def main():
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    names = sys.argv[2:] or list(WORKLOADS)
    procs = [(n, subprocess.Popen([sys.executable, __file__, "--child", n, outdir], env=env)) for n in names]
    bad = [n for n, p in procs if p.wait() != 0]
    if bad:
        sys.exit("failed: " + ", ".join(bad))


if __name__ == "__main__":
    main()

"""Recordings of Llama-architecture training jobs on one GPU, for the
comparison of allocators that issue 33 asks for (STAlloc's and GMLake's
published figures beside ours).

    python3 testdata/llama/record.py OUTDIR [JOB...]

Each job runs in a process of its own, with PYTORCH_CUDA_ALLOC_CONF as the
job says (the default allocator, or expandable segments), and records as
the README tells users to: torch.cuda.memory._record_memory_history() with
PyTorch's defaults (Python and C++ stacks), _dump_snapshot at the end. It
writes OUTDIR/NAME.pickle.gz and OUTDIR/NAME.stats.json (the real
allocator's max_memory_reserved, max_memory_allocated and memory_stats(),
as testdata/pytorch/record.py writes them).

The model is transformers' LlamaForCausalLM with random weights (no
download): 16 layers, hidden 2048, 16 heads, MLP 5504, vocabulary 32000,
about 1.0e9 parameters, AdamW, bf16 autocast, activation recomputation
(gradient checkpointing). The jobs:

  train_sN          pre-training steps at a fixed sequence length N
                    (1024, 2048, 4096; tokens per step 8192), 4 steps
  lora_var          LoRA fine-tuning (peft, rank 16 on q,k,v,o), batches
                    of 4 sequences of random lengths 128..2048, 10 steps
  full_var          full fine-tuning, the same batches, 8 steps

each as NAME (the default allocator) and NAME_expandable
(expandable_segments:True).
"""
import gzip
import json
import os
import random
import subprocess
import sys
import time

JOBS = ["train_s1024", "train_s2048", "train_s4096", "lora_var", "full_var"]


def model(torch):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5504, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096)
    torch.manual_seed(1234)
    m = LlamaForCausalLM(cfg).cuda()
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.config.use_cache = False
    m.train()
    return m


def steps_fixed(torch, m, seq, steps):
    batch = 8192 // seq
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
    for _ in range(steps):
        ids = torch.randint(0, 32000, (batch, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()


def steps_var(torch, m, steps, lora):
    rng = random.Random(7)
    if lora:
        from peft import LoraConfig, get_peft_model
        m = get_peft_model(m, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0))
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-5)
    for _ in range(steps):
        seq = rng.randint(128, 2048)
        ids = torch.randint(0, 32000, (4, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()


def child(job, label, outdir):
    import torch
    torch.cuda.init()
    torch.cuda.memory._record_memory_history()  # PyTorch's defaults, as users record
    t0 = time.time()
    m = model(torch)
    if job.startswith("train_s"):
        steps_fixed(torch, m, int(job[len("train_s"):]), 4)
    elif job == "lora_var":
        steps_var(torch, m, 10, lora=True)
    elif job == "full_var":
        steps_var(torch, m, 8, lora=False)
    torch.cuda.synchronize()
    wall = time.time() - t0
    path = os.path.join(outdir, label)
    torch.cuda.memory._dump_snapshot(path + ".pickle")
    with open(path + ".pickle", "rb") as fin, gzip.open(path + ".pickle.gz", "wb") as fout:
        fout.write(fin.read())
    os.remove(path + ".pickle")
    snap = torch.cuda.memory._snapshot()
    stats = {
        "workload": job,
        "label": label,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "wall_s": wall,
        "mem_cap_bytes": 0,
        "oom": "",
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "memory_reserved_end": torch.cuda.memory_reserved(),
        "memory_allocated_end": torch.cuda.memory_allocated(),
        "trace_entries": len(snap["device_traces"][0]),
        "memory_stats": dict(torch.cuda.memory_stats()),
    }
    with open(path + ".stats.json", "w") as f:
        json.dump(stats, f, indent=1)
    print(label, {k: stats[k] for k in ("max_memory_reserved", "max_memory_allocated", "trace_entries", "wall_s")}, flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    outdir = sys.argv[1]
    jobs = sys.argv[2:] or JOBS
    os.makedirs(outdir, exist_ok=True)
    procs = []
    for job in jobs:
        for label, conf in ((job, ""), (job + "_expandable", "expandable_segments:True")):
            env = dict(os.environ)
            env.pop("PYTORCH_ALLOC_CONF", None)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            procs.append((label, subprocess.Popen([sys.executable, __file__, "--child", job, label, outdir], env=env)))
            # Two jobs at a time share the GPU: their recordings are each
            # process's own; only their times are not.
            if len(procs) % 2 == 0:
                for _, p in procs[-2:]:
                    p.wait()
    bad = [label for label, p in procs if p.wait() != 0]
    if bad:
        sys.exit("failed: " + ", ".join(bad))


if __name__ == "__main__":
    main()

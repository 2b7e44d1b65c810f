#!/usr/bin/env python3
"""Record JAX jobs three ways, each a fresh process of the same seeded
workload, for the bfc policy's ground truth.

    python3 record.py OUTDIR RECORD    (RECORD: the path of bin/record)
    python3 record.py --xspace OUTDIR  (the profiled BFC runs only)

For each workload NAME it writes
  NAME.platform.trace  `record run` of the job under
                       XLA_PYTHON_CLIENT_ALLOCATOR=platform: every buffer XLA
                       asks for, as its own device allocation;
  NAME.bfc.*           the job under XLA's default BFC allocator
                       (preallocating XLA_PYTHON_CLIENT_MEM_FRACTION of the
                       card at start-up);
  NAME.growth.*        the same with XLA_PYTHON_CLIENT_PREALLOCATE=false (BFC
                       growing its regions on demand);
where each BFC mode is run twice: once under jax.profiler.trace, writing
MODE.xplane.pb (the profiler's XSpace, whose allocator events carry BFC's
own figures) and MODE.json, and once under `record run`, writing MODE.trace
(the regions BFC takes from the driver) and MODE.rec.json. Each .json holds
jax.devices()[0].memory_stats() at the end of the job, the allocator
environment and the versions.

Workloads (seeded):
  train  a jitted 2-layer MLP trained by gradient descent on batches of 64,
         128, 192 and 256 rows in turn (one program per shape), then three
         large arrays made and dropped;
  attn   jitted multi-head attention inference over batch sizes 1..8 and
         sequence lengths 128..2048, each shape a few times, outputs kept
         for a while and dropped.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile


def train(jax, jnp):
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    params = {"w1": jax.random.normal(k1, (1024, 4096)) * 0.02, "w2": jax.random.normal(k2, (4096, 1024)) * 0.02}

    def loss(p, x):
        h = jax.nn.relu(x @ p["w1"])
        return jnp.mean(jnp.square(h @ p["w2"]))

    @jax.jit
    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g)

    for it in range(24):
        x = jax.random.normal(jax.random.fold_in(k3, it), (64 * (1 + it % 4), 1024))
        params = step(params, x)
    jax.block_until_ready(params)
    big = [jnp.zeros((n << 20,), jnp.uint8) for n in (3, 30, 300)]
    jax.block_until_ready(big)
    del big


def attn(jax, jnp):
    heads, dim = 16, 64
    key = jax.random.PRNGKey(1)
    wq, wk, wv, wo = (jax.random.normal(k, (heads * dim, heads * dim)) * 0.02 for k in jax.random.split(key, 4))

    @jax.jit
    def layer(x):
        b, s, _ = x.shape
        q = (x @ wq).reshape(b, s, heads, dim)
        k = (x @ wk).reshape(b, s, heads, dim)
        v = (x @ wv).reshape(b, s, heads, dim)
        a = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 8.0
        a = jax.nn.softmax(a, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, s, heads * dim)
        return o @ wo

    keep = []
    shapes = [(1, 128), (4, 512), (8, 256), (2, 2048), (1, 1024), (8, 512), (4, 128), (2, 1024)]
    for i, (b, s) in enumerate(shapes * 2):
        x = jax.random.normal(jax.random.fold_in(key, i), (b, s, heads * dim))
        y = layer(x)
        keep.append(y)
        if len(keep) > 3:
            keep.pop(0)
        jax.block_until_ready(y)
    del keep


WORKLOADS = {"train": train, "attn": attn}


def child(workload, out, profile):
    import jax
    import jax.numpy as jnp
    tmp = None
    if profile:
        tmp = tempfile.mkdtemp()
        # The host tracer at its default level holds the allocator's events;
        # the Python tracer and the HLO protos only make the file large.
        opts = jax.profiler.ProfileOptions()
        opts.python_tracer_level = 0
        opts.enable_hlo_proto = False
        try:
            jax.profiler.start_trace(tmp, profiler_options=opts)
        except TypeError:  # a JAX without profiler_options
            jax.profiler.start_trace(tmp)
    WORKLOADS[workload](jax, jnp)
    if profile:
        jax.profiler.stop_trace()
        pbs = glob.glob(os.path.join(tmp, "plugins", "profile", "*", "*.xplane.pb"))
        shutil.copy(pbs[0], out + ".xplane.pb")
    rec = {
        "workload": workload,
        "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
        "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true"),
        "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", ""),
        "jax": jax.__version__,
        "jaxlib": getattr(__import__("jaxlib"), "__version__", ""),
        "device": jax.devices()[0].device_kind,
        "stats": jax.devices()[0].memory_stats(),
    }
    with open(out + ".json", "w") as f:
        json.dump(rec, f, indent=1)
    print(os.path.basename(out), json.dumps(rec["stats"]), flush=True)


def run(args, env_extra, log):
    env = dict(os.environ)
    for k in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        env.pop(k, None)
    env.update(env_extra)
    with open(log, "w") as f:
        r = subprocess.run(args, env=env, stdout=f, stderr=subprocess.STDOUT)
    with open(log) as f:
        sys.stdout.write("".join(l for l in f if l.startswith(("train", "attn", "record"))))
    if r.returncode:
        print("FAILED", args, r.returncode, flush=True)


def main():
    if sys.argv[1] == "--xspace":
        # Only the profiled BFC runs (the XSpaces), into OUTDIR.
        outdir = sys.argv[2]
        os.makedirs(outdir, exist_ok=True)
        me = [sys.executable, os.path.abspath(__file__), "--child"]
        for w in WORKLOADS:
            o = os.path.join(outdir, w)
            for mode, env in (("bfc", {}), ("growth", {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})):
                run(me + [w, o + "." + mode, "1"], env, o + "." + mode + ".log")
        return
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4] == "1")
        return
    outdir, record = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    for w in WORKLOADS:
        o = os.path.join(outdir, w)
        run([record, "run", "-o", o + ".platform.trace", "--"] + me + [w, o + ".platform", "0"],
            {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, o + ".platform.log")
        for mode, env in (("bfc", {}), ("growth", {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})):
            run(me + [w, o + "." + mode, "1"], env, o + "." + mode + ".log")
            run([record, "run", "-o", o + "." + mode + ".trace", "--"] + me + [w, o + "." + mode + ".rec", "0"], env,
                o + "." + mode + ".rec.log")


if __name__ == "__main__":
    main()

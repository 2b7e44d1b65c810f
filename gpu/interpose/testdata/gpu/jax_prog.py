# jax_prog.py is the JAX training job that the GPU-machine check records
# with `record run`: a jitted MLP trained by plain gradient descent on
# batches of varying size (so XLA compiles several programs and allocates
# buffers of several sizes), then a few large arrays. It prints one JSON
# line: the device's memory_stats() (None under the platform allocator),
# the allocator in use and the versions.
import json
import os
import sys

import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(0)
k1, k2, k3 = jax.random.split(key, 3)
params = {
    "w1": jax.random.normal(k1, (1024, 4096)) * 0.02,
    "w2": jax.random.normal(k2, (4096, 1024)) * 0.02,
}


def loss(p, x):
    h = jax.nn.relu(x @ p["w1"])
    return jnp.mean(jnp.square(h @ p["w2"]))


@jax.jit
def step(p, x):
    g = jax.grad(loss)(p, x)
    return jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g)


for it in range(30):
    x = jax.random.normal(jax.random.fold_in(k3, it), (64 * (1 + it % 4), 1024))
    params = step(params, x)
jax.block_until_ready(params)
big = [jnp.zeros((n << 20,), jnp.uint8) for n in (3, 30, 300)]
jax.block_until_ready(big)
del big
stats = jax.devices()[0].memory_stats()
out = {
    "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
    "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true"),
    "jax": jax.__version__,
    "stats": stats,
}
print(json.dumps(out))
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)

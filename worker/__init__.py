"""The audit engine: stages, sandbox, numerics and canary."""

import os

# before anything in this process touches a GPU: see worker.numerics.gpu_memory (a value set by the operator wins)
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

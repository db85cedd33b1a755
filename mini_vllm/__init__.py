"""mini-vLLM: the reference engine of the course, mirroring vLLM v0.22.1's V1 engine.

Modules mirror upstream's layout (``mini_vllm/core/block_pool.py`` beside
``vllm/v1/core/block_pool.py``) so that the two can be read side by side.
Importing the package is cheap on purpose: the core labs need only numpy, so
torch-dependent modules are imported lazily by the code that needs them.
"""

__version__ = "0.1.0"
UPSTREAM_VERSION = "0.22.1"

"""mini-vLLM: the reference engine of the course, mirroring vLLM v0.22.1's V1 engine.

Modules mirror upstream's layout so that the two read side by side. Importing the package is
cheap: the core labs need only numpy, so torch is imported lazily by the code that needs it.
"""

__version__ = "0.1.0"
UPSTREAM_VERSION = "0.22.1"
